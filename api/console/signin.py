"""Signing in (an API key, typed once, becomes a session cookie) and out."""

from __future__ import annotations

import hmac

from fastapi import APIRouter, Depends, Form, Query, Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from core.errors import CsrfRefused

from ..deps import Services, services
from ..guard import body_limit, public
from .actions import FORM_LIMIT, Csrf, actor
from .pages import signed_in
from .render import ConsoleRoute, page
from .session import (
    PATH,
    SIGN_IN_COOKIE,
    SIGN_IN_PATH,
    Viewer,
    clear_session,
    new_sign_in_token,
    safe_next,
    set_session,
    set_sign_in_token,
)

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)


def _form(request: Request, next_path: str, status_code: int = 200, error: str | None = None
          ) -> Response:
    token = new_sign_in_token()
    response = page("sign_in.html", status_code=status_code, viewer=None, csrf=token,
                    next_path=safe_next(next_path), error=error)
    set_sign_in_token(response, request, token)
    return response


@router.get(SIGN_IN_PATH)
@public
def sign_in_form(request: Request, next_path: str | None = Query(
        default=None, alias="next", max_length=500)) -> Response:
    return _form(request, next_path or PATH)


@router.post(SIGN_IN_PATH)
@body_limit(lambda _settings: 8 * 1024)
@public
def sign_in(request: Request, key: str = Form(max_length=200), csrf: str | None = Csrf,
            next_path: str = Form(default=PATH, alias="next", max_length=500),
            svc: Services = Depends(services)) -> Response:
    """The form's token must match its cookie (no other site can post a sign-in); a
    wrong key is the form again, with a 401."""
    expected = request.cookies.get(SIGN_IN_COOKIE) or ""
    if not csrf or not expected or not hmac.compare_digest(csrf.encode(), expected.encode()):
        raise CsrfRefused("the sign-in form has expired; load it again")
    opened = svc.console_sessions.open(key.strip(), svc.settings.console_idle_s)
    if opened is None:
        return _form(request, next_path, 401, "That key was not accepted (unknown or revoked).")
    token, _session = opened
    response = RedirectResponse(safe_next(next_path), status_code=303)
    set_session(response, request, token)
    return response


@router.post(PATH + "/sign-out")
@FORM_LIMIT
@signed_in
async def sign_out(svc: Services = Depends(services),
                   who: Viewer = Depends(actor)) -> Response:
    await run_in_threadpool(svc.console_sessions.close, who.token)
    response = RedirectResponse(SIGN_IN_PATH, status_code=303)
    clear_session(response)
    return response
