"""Checks every response the test suite reads from an OpenAI route against the pinned
OpenAPI document: the HTTP clients' ``send`` is wrapped once per run (httpx, which the
tests and FastAPI's TestClient use, and httpx2, which the openai SDK uses), and each
response that was read whole is checked (``conformance.check``). What does not conform
is kept for the test that received it, which then fails (see tests/conftest.py)."""

from __future__ import annotations

import functools
import importlib

from .conformance import check, operation

problems: list[str] = []
checked = 0


def _inspect(response) -> None:
    global checked
    request = response.request
    if operation(request.method, request.url.path) is None:
        return
    if not hasattr(response, "_content"):  # streamed to the caller, not read whole
        return
    checked += 1
    problems.extend(check(request.method, request.url.path, response.status_code,
                          response.headers.get("content-type", ""), response.content))


def _wrap_sync(send):
    @functools.wraps(send)
    def wrapped(self, request, *args, **kwargs):
        response = send(self, request, *args, **kwargs)
        _inspect(response)
        return response
    wrapped.conformance = True
    return wrapped


def _wrap_async(send):
    @functools.wraps(send)
    async def wrapped(self, request, *args, **kwargs):
        response = await send(self, request, *args, **kwargs)
        _inspect(response)
        return response
    wrapped.conformance = True
    return wrapped


def install() -> None:
    for name in ("httpx", "httpx2"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        for cls, wrap in ((module.Client, _wrap_sync), (module.AsyncClient, _wrap_async)):
            if not getattr(cls.send, "conformance", False):
                cls.send = wrap(cls.send)


def take() -> list[str]:
    found = list(problems)
    problems.clear()
    return found
