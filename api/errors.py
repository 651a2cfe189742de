"""The one place where errors become HTTP responses, in OpenAI's error shape."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from core.errors import OmniJobsError, ServiceUnavailable, clip
from storage.db import UNAVAILABLE_ERRORS

log = logging.getLogger(__name__)

HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}
# A path is echoed whole (the route and its ids: a cut one names no resource), up to a
# bound that keeps an absurd URL out of the answer.
PATH_ECHO_LIMIT = 256
METHODS = ("DELETE", "GET", "HEAD", "PATCH", "POST", "PUT")


def error_body(message: str, type_: str, code: str | None, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(exc: OmniJobsError) -> JSONResponse:
    headers = {"x-should-retry": "true" if exc.retryable else "false"}
    if exc.retry_after_s is not None:
        headers["Retry-After"] = str(exc.retry_after_s)
    return JSONResponse(error_body(exc.message, exc.error_type, exc.code, exc.param),
                        status_code=exc.http_status, headers=headers)


def as_service_error(exc: Exception) -> OmniJobsError | None:
    """Our own errors as they are; the database being down or saturated (on any route,
    the auth lookup included) as a 503 with Retry-After; anything else is None."""
    if isinstance(exc, OmniJobsError):
        return exc
    if isinstance(exc, UNAVAILABLE_ERRORS):
        log.warning("database unavailable: %s", type(exc).__name__)
        return ServiceUnavailable("the database is unavailable; try again shortly")
    return None


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    err = exc.errors()[0]
    loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path", "header")]
    param = ".".join(loc) or None
    msg = err.get("msg", "invalid value")
    if err.get("type") == "json_invalid":
        return "request body is not valid JSON", None
    if err.get("type") == "missing":
        if param is None:
            return "a JSON request body is required", None
        return f"missing required parameter '{clip(param)}'", clip(param)
    if "input" in err and err.get("type") not in ("string_too_long",):
        msg = f"{msg} (got {clip(err['input'])})"
    return (f"invalid '{clip(param)}': {msg}" if param else msg), clip(param) if param else None


def _http_message(req: Request, exc: StarletteHTTPException) -> str:
    """The router's own 404/405 name the route that was asked for, not just a status."""
    route = f"{req.method} {clip(req.url.path, PATH_ECHO_LIMIT)}"
    if exc.status_code == 404 and exc.detail == "Not Found":
        return f"no such route: {route} (the API is under /v1; see /docs)"
    if exc.status_code == 405 and exc.detail == "Method Not Allowed":
        return f"method not allowed: {route}; this path allows {', '.join(allowed(req))}"
    return str(exc.detail)


def allowed(req: Request) -> list[str]:
    """Every method a route serves at this path, asked of the router itself (one scope
    per method). Starlette's own ``Allow`` names only the methods of the first route
    whose path matched, and ``GET`` and ``DELETE`` of one path are two routes."""
    from starlette.routing import Match

    return [method for method in METHODS if any(
        route.matches({**req.scope, "method": method})[0] is Match.FULL
        for route in req.app.router.routes)]


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OmniJobsError)
    async def _omni(_req: Request, exc: OmniJobsError) -> JSONResponse:
        return error_response(exc)

    for unavailable in UNAVAILABLE_ERRORS:
        @app.exception_handler(unavailable)
        async def _unavailable(_req: Request, exc: Exception) -> JSONResponse:
            return error_response(as_service_error(exc))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_req: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return JSONResponse(error_body(message, "invalid_request_error", "invalid_request",
                                       param), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(req: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = HTTP_CODES.get(exc.status_code, "http_error")
        headers = exc.headers
        if exc.status_code == 405:
            headers = {**(headers or {}), "Allow": ", ".join(allowed(req))}
        return JSONResponse(error_body(_http_message(req, exc), "invalid_request_error", code),
                            status_code=exc.status_code, headers=headers)

    @app.exception_handler(Exception)
    async def _unexpected(_req: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return JSONResponse(error_body("internal server error", "server_error",
                                       "internal_error"), status_code=500)
