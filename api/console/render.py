"""Pages from Jinja2 templates shipped inside the package, the headers every console
response carries (a Content-Security-Policy that allows this origin only), and the
route class that answers a console error as a page rather than as JSON."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from datetime import UTC, datetime
from urllib.parse import quote

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.exceptions import HTTPException as StarletteHTTPException

from core.errors import AuthenticationFailed, InvalidRequest, OmniJobsError
from storage.db import UNAVAILABLE_ERRORS

from ..errors import _validation_message, as_service_error
from ..guard import GuardedRoute
from .session import SIGN_IN_PATH

log = logging.getLogger(__name__)

# Nothing from another origin, no inline script, no framing: the console and /docs work
# offline and a page that slipped markup in could not run it.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "media-src 'self'; connect-src 'self'; font-src 'self'; form-action 'self'; "
       "frame-ancestors 'none'; base-uri 'none'")
SECURITY_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                    "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY"}
NO_STORE = {"Cache-Control": "no-store"}
# What an action's redirect may ask its page to say (``?notice=``): a fixed vocabulary,
# so no text from a URL is ever shown.
NOTICES = {
    "cancelled": "The job is cancelled.",
    "deleted": "The job and its outputs are deleted.",
    "replayed": "The delivery is due again: its new attempt appears below once it is sent.",
    "batch_cancelled": "The batch is cancelling: queued jobs are cancelled, running ones stop.",
    "test_sent": "The test event was delivered; the receiver answered {status}.",
    "test_failed": "The test event could not be delivered to the endpoint.",
}
_request: ContextVar[Request | None] = ContextVar("console_request", default=None)

templates = Environment(loader=PackageLoader("api.console", "templates"),
                        autoescape=select_autoescape(default=True), trim_blocks=True,
                        lstrip_blocks=True)


def when(value: datetime | int | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, int | float):
        value = datetime.fromtimestamp(value, UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def age(value: datetime | None, now: datetime | None = None) -> str:
    if value is None:
        return "-"
    seconds = max(0, int(((now or datetime.now(UTC)) - value).total_seconds()))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


templates.filters.update(when=when, size=size, age=age, q=lambda v: quote(str(v), safe=""))


def render(name: str, **context) -> str:
    return templates.get_template(name).render(**context)


def notice() -> str | None:
    request = _request.get()
    key = request.query_params.get("notice") if request is not None else None
    if key not in NOTICES:
        return None
    status = request.query_params.get("status", "")
    return NOTICES[key].format(status=status if status.isdigit() else "?")


def page(name: str, status_code: int = 200, **context) -> HTMLResponse:
    context.setdefault("notice", notice())
    return HTMLResponse(render(name, **context), status_code=status_code, headers=NO_STORE)


def error_page(exc: OmniJobsError) -> HTMLResponse:
    return page("error.html", status_code=exc.http_status, error=exc, viewer=None)


def _as_error(exc: Exception) -> OmniJobsError | None:
    if isinstance(exc, RequestValidationError):
        message, param = _validation_message(exc)
        return InvalidRequest(message, param=param)
    if isinstance(exc, StarletteHTTPException):
        err = OmniJobsError(str(exc.detail))
        err.http_status = exc.status_code
        return err
    return as_service_error(exc)


def _signed_out(request: Request) -> Response:
    """A page sends the browser to the sign-in form (and back after); anything else,
    an action or a stream, is a 401."""
    if request.method == "GET" and "text/event-stream" not in request.headers.get(
            "accept", ""):
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"{SIGN_IN_PATH}?next={quote(target, safe='')}",
                                status_code=303)
    return page("error.html", status_code=401, viewer=None,
                error=OmniJobsError("sign in to use the console"))


class ConsoleRoute(GuardedRoute):
    """A console route: the guard first (the session instead of a key), then the page;
    errors are pages, and every response carries the security headers."""

    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
        handler = super().get_route_handler()

        async def console(request: Request) -> Response:
            _request.set(request)
            try:
                response = await handler(request)
            except AuthenticationFailed:
                response = _signed_out(request)
            except (OmniJobsError, RequestValidationError, StarletteHTTPException,
                    *UNAVAILABLE_ERRORS) as exc:
                err = _as_error(exc)
                if err.http_status >= 500:
                    log.warning("console: %s", err.message)
                response = error_page(err)
            response.headers.update(SECURITY_HEADERS)
            return response
        return console
