"""The request guard: what every route of ours does before its handler reads the body.

1. The API key is checked from the headers alone, so an anonymous or wrong-key request
   is answered 401 before one byte of its body is read or parsed. A route may name
   another check of the headers instead (``authenticated_by``: the console's session
   cookie), run at the same point.
2. The body is capped by its route's limit (``OMNIJOBS_MAX_BODY_BYTES`` unless the route
   declares its own with ``body_limit``): a declared length over it is a 413 at once, a
   streamed body is cut off with a 413 as soon as it passes it; the rest is never read.
3. One access-log line per request (``AccessLog``, a middleware): method, path (never the
   query string, which may carry a URL signature), status, duration and tenant; no
   header is ever logged. The same middleware records the request's latency by route
   template and status (``omnijobs_http_request_duration_seconds``).

Starlette's own body limit answers in plain text and overrides any earlier answer (a
401 included), so neither the error shape nor the key-before-body order would hold with
it. Paths that match no route get no key check: they are a 404 either way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from functools import lru_cache

from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core.errors import PayloadTooLarge, clip
from core.settings import Settings

from .auth import Authenticator, bearer_key
from .metrics import REQUEST_LATENCY

access_log = logging.getLogger("omnijobs.access")

POLICY_ATTR = "__omnijobs_policy__"
# Methods a metric label may name; any other (a client may send any token) is "other".
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
Limit = Callable[[Settings], int]
# Checks a request's headers (never its body) and answers who is asking, or raises.
Authenticate = Callable[[Request], Awaitable[object]]


@dataclass(frozen=True)
class Policy:
    """What a route asks of the guard: no key (``public``), another body limit, or
    another way to authenticate (``authenticate``, which sets ``request.state.viewer``)."""

    public: bool = False
    max_body_bytes: Limit | None = None
    authenticate: Authenticate | None = None


def policy_of(endpoint: Callable) -> Policy:
    return getattr(endpoint, POLICY_ATTR, Policy())


def public(endpoint: Callable) -> Callable:
    """Declare a route that takes no API key (health, signed file URLs)."""
    setattr(endpoint, POLICY_ATTR, replace(policy_of(endpoint), public=True))
    return endpoint


def authenticated_by(check: Authenticate) -> Callable[[Callable], Callable]:
    """Declare a route authenticated by ``check`` (from the headers, before the body is
    read) instead of an API key."""

    def declare(endpoint: Callable) -> Callable:
        setattr(endpoint, POLICY_ATTR, replace(policy_of(endpoint), authenticate=check))
        return endpoint
    return declare


def body_limit(limit: Limit) -> Callable[[Callable], Callable]:
    """Declare a route's own body limit, e.g. an upload route:
    ``@body_limit(lambda s: s.max_file_bytes)`` under its ``@router.post(...)``."""

    def declare(endpoint: Callable) -> Callable:
        setattr(endpoint, POLICY_ATTR, replace(policy_of(endpoint), max_body_bytes=limit))
        return endpoint
    return declare


class BodyTooLarge(StarletteHTTPException):
    """Raised from ``receive``: an HTTPException, so FastAPI's body parsing lets it
    through unchanged and the error handlers answer 413."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body is larger than {limit} bytes")


class GuardedRoute(APIRoute):
    """Every route of ours: key and size checks run before the route's handler, which
    is what reads and parses the body (``APIRouter(route_class=GuardedRoute)``)."""

    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
        handler = super().get_route_handler()
        policy = policy_of(self.endpoint)

        async def guarded(request: Request) -> Response:
            svc = request.app.state.services
            if policy.authenticate is not None:
                request.state.viewer = await policy.authenticate(request)
            elif not policy.public:
                request.state.tenant_id = await _tenant(svc.auth, request)
            limit = (policy.max_body_bytes or _default_limit)(svc.settings)
            if _declared_length(request) > limit:
                raise PayloadTooLarge(f"request body is larger than {limit} bytes")
            return await handler(Request(request.scope, _limited(request.receive, limit)))
        return guarded


async def _tenant(auth: Authenticator, request: Request) -> str:
    key = bearer_key(request.headers.get("authorization"))
    return auth.cached(key) or await run_in_threadpool(auth.tenant_for, key)


class AccessLog:
    """One line per request, from the scope alone: no query string, no header."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        status: list[int] = []

        async def send_noting_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_noting_status)
        finally:
            _log_access(scope, status[0] if status else 500, started)


def _default_limit(settings: Settings) -> int:
    return settings.max_body_bytes


def _declared_length(request: Request) -> int:
    try:
        return int(request.headers.get("content-length", "0"))
    except ValueError:
        return 0  # the server refuses a malformed length itself


def _limited(receive: Receive, limit: int) -> Receive:
    seen = 0

    async def receive_within_limit() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise BodyTooLarge(limit)
        return message
    return receive_within_limit


@lru_cache(maxsize=1024)
def _latency(method: str, route: str, status: int):
    """The histogram's child for these labels, looked up once (``labels`` validates
    and locks on every call). The labels are bounded: methods, route templates, codes."""
    return REQUEST_LATENCY.labels(method, route, status)


def _log_access(scope: Scope, status: int, started: float) -> None:
    elapsed = time.monotonic() - started
    method = scope.get("method")
    _latency(method if method in METHODS else "other",
             getattr(scope.get("route"), "path", "unmatched"), status).observe(elapsed)
    state = scope.get("state") or {}
    path = clip(scope.get("path", ""), 200)
    access_log.info("%s %s %s", scope.get("method"), path, status, extra={
        "method": scope.get("method"), "path": path, "status": status,
        "duration_ms": round(elapsed * 1000, 1), "tenant_id": state.get("tenant_id")})
