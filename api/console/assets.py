"""Static files from the installed package: the console's stylesheet and script, and
Swagger UI for ``/docs`` (from the ``fastapi-offline`` package, which ships Swagger UI
5's bundle), so neither needs another host. ``/docs`` gets the same
Content-Security-Policy as the console: this origin only."""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, Response

from core.errors import NotFound

from ..guard import public
from .render import ConsoleRoute, page
from .session import PATH

STATIC = Path(__file__).parent / "static"
SWAGGER = Path(fastapi_offline.__file__).parent / "static"
SWAGGER_FILES = ("swagger-ui-bundle.js", "swagger-ui.css", "favicon.png")
CACHE = {"Cache-Control": "public, max-age=3600"}

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)


def _file(folder: Path, names, name: str) -> FileResponse:
    """Only the files named here: no path from a request ever reaches the disk."""
    if name not in names:
        raise NotFound(f"no asset named '{name[:32]}'")
    return FileResponse(folder / name, headers=CACHE)


CONSOLE_FILES = tuple(sorted(p.name for p in STATIC.iterdir() if p.is_file()))


@router.get(PATH + "/static/{name}")
@public
def console_asset(name: str) -> FileResponse:
    return _file(STATIC, CONSOLE_FILES, name)


@router.get("/docs/assets/{name}")
@public
def docs_asset(name: str) -> FileResponse:
    if name == "docs.js":
        return FileResponse(STATIC / "docs.js", headers=CACHE)
    return _file(SWAGGER, SWAGGER_FILES, name)


@router.get("/docs")
@public
def docs(request: Request) -> Response:
    """Swagger UI over ``/openapi.json``, every file from this origin."""
    return page("docs.html", title=request.app.title, openapi_url=request.app.openapi_url)
