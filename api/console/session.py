"""Who is looking at the console: a session cookie opened by signing in with an API key.

The key is typed into the sign-in form once and never appears again: not in a URL, not
in a page, not in the cookie (which holds a random token whose SHA-256 the database
keeps). The cookie is HttpOnly, SameSite=Strict, Secure when the console is served over
TLS, and lives under ``/console`` only; the session ends after
``OMNIJOBS_CONSOLE_IDLE_S`` without a request, at sign-out, or when its key is revoked.

Every action (a POST) carries the session's CSRF token, as a form field or an
``X-CSRF-Token`` header; the sign-in form carries one tied to a short-lived cookie of
its own, so a page elsewhere cannot sign a browser in with another key.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass

from fastapi import Request, Response
from starlette.concurrency import run_in_threadpool

from core.errors import CsrfRefused, SignInRequired
from storage.records import SessionRecord

COOKIE = "omnijobs_console"
SIGN_IN_COOKIE = "omnijobs_console_sign_in"
PATH = "/console"
SIGN_IN_PATH = PATH + "/sign-in"
CSRF_HEADER = "x-csrf-token"
TOKEN_MAX = 128  # longer cookies are not ours: refused without a lookup


@dataclass(frozen=True)
class Viewer:
    """The signed-in session: its tenant, whether its key is an operator's, its CSRF
    token. ``scope`` is what reads pass to the repositories: the tenant, or None (every
    tenant) for an operator."""

    session: SessionRecord
    token: str

    @property
    def operator(self) -> bool:
        return self.session.operator

    @property
    def scope(self) -> str | None:
        return None if self.session.operator else self.session.tenant_id

    @property
    def csrf(self) -> str:
        return self.session.csrf

    def acts_as(self, owner_tenant: str) -> str:
        """The tenant an action on a resource of ``owner_tenant`` runs as: the owner's,
        for an operator (who sees it); a tenant only ever reaches its own resources."""
        return owner_tenant if self.operator else self.session.tenant_id


async def authenticate(request: Request) -> Viewer:
    """The guard's check for console routes: the session cookie, from the headers."""
    token = request.cookies.get(COOKIE)
    if not token or len(token) > TOKEN_MAX:
        raise SignInRequired("sign in to use the console")
    svc = request.app.state.services
    record = await run_in_threadpool(svc.console_sessions.check, token,
                                     svc.settings.console_idle_s)
    if record is None:
        raise SignInRequired("the session has ended (signed out, idle or revoked); sign in")
    request.state.tenant_id = record.tenant_id  # for the access log, as for a key
    return Viewer(record, token)


async def viewer(request: Request) -> Viewer:
    """The dependency a console route takes: what the guard authenticated."""
    found = getattr(request.state, "viewer", None)
    if found is None:
        raise SignInRequired("sign in to use the console")
    return found


def check_csrf(expected: str, request: Request, form_token: str | None) -> None:
    """Refuse an action whose token (form field or header) is missing or not this
    session's."""
    given = form_token or request.headers.get(CSRF_HEADER) or ""
    if not given or not hmac.compare_digest(given.encode(), expected.encode()):
        raise CsrfRefused("this action is missing its CSRF token (reload the page and try "
                          "again)")


def secure(request: Request) -> bool:
    return request.url.scheme == "https"


def set_session(response: Response, request: Request, token: str) -> None:
    response.set_cookie(COOKIE, token, path=PATH, httponly=True, samesite="strict",
                        secure=secure(request))
    response.delete_cookie(SIGN_IN_COOKIE, path=SIGN_IN_PATH)


def clear_session(response: Response) -> None:
    response.delete_cookie(COOKIE, path=PATH)


def new_sign_in_token() -> str:
    return secrets.token_urlsafe(32)


def set_sign_in_token(response: Response, request: Request, token: str) -> None:
    """The sign-in form's CSRF token, in a cookie of its own for ten minutes."""
    response.set_cookie(SIGN_IN_COOKIE, token, path=SIGN_IN_PATH, max_age=600, httponly=True,
                        samesite="strict", secure=secure(request))


def safe_next(value: str | None) -> str:
    """Where to go after signing in: a console path of ours, never another site."""
    if value and value.startswith(PATH) and not value.startswith("//") and "\\" not in value:
        return value
    return PATH
