"""The operator's console: server-rendered pages over the API's own repositories and
route functions, at ``/console`` (see docs/console.md), and ``/docs`` served offline."""

from __future__ import annotations

from fastapi import FastAPI

from . import actions, assets, live, media, pages, signin


def install(app: FastAPI) -> None:
    for module in (signin, pages, actions, live, media, assets):
        app.include_router(module.router)
