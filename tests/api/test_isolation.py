"""Tenant isolation, generated from the app's route table: every route that takes an id
answers 404 to another tenant. A route whose id this test does not know how to make
fails here until it is taught, so no route can be added without being covered."""

from __future__ import annotations

import re
import uuid

import httpx
import pytest
from fastapi.routing import APIRoute

from api.guard import GuardedRoute, policy_of

from ..integration.helpers import assert_openai_error

# How to make a resource of the owning tenant for each kind of id a path can take.
MAKE = {
    "job_id": lambda c: c.post("/v1/audio/speech", headers={"Prefer": "respond-async"},
                               json={"model": "tts-1", "input": "Mine."}),
    "video_id": lambda c: c.post("/v1/videos", json={"prompt": "Mine.", "seconds": 1}),
    "endpoint_id": lambda c: c.post("/v1/webhook_endpoints",
                                    json={"name": "mine", "url": "http://127.0.0.1:9/hook",
                                          "event_types": ["speech.completed"]}),
    "file_id": lambda c: c.post("/v1/files", data={"purpose": "batch"},
                                files={"file": ("mine.jsonl", b"{}\n")}),
    "batch_id": lambda c: c.post("/v1/batches", json={
        "input_file_id": MAKE["file_id"](c).json()["id"], "endpoint": "/v1/audio/speech",
        "completion_window": "24h"}),
    "delivery_id": lambda c: _delivery(c),
}


def _delivery(c):
    """A job with its own webhook_url, cancelled: its ``cancelled`` event's delivery."""
    job = c.post("/v1/audio/speech", headers={"Prefer": "respond-async"}, json={
        "model": "tts-1", "input": "Mine.", "webhook_url": "http://127.0.0.1:9/hook"}).json()
    c.post(f"/v1/jobs/{job['id']}/cancel")
    log = c.get(f"/v1/jobs/{job['id']}/webhook_deliveries")
    return httpx.Response(log.status_code, json=log.json()["data"][0])
# Bodies a route needs before it looks its id up (so both tenants reach the lookup).
BODY = {
    "/v1/webhook_endpoints/{endpoint_id}": {"name": "renamed"},
    "/v1/webhook_endpoints/{endpoint_id}/test": {"event_type": "speech.completed"},
}
# Routes that answer their owner with an error of their own once they found the id.
OWNER_ERRORS = {"/v1/videos/{video_id}/remix": "unsupported_capability"}
# Routes whose ids are not a tenant's, and what protects them instead.
NOT_TENANT_SCOPED = {
    "/v1/objects/{key:path}": "signed URLs: the HMAC signature grants access (test_bad_ids)",
    "/v1/models/{model:anytext}": "the deployment's models, the same for every tenant "
                               "(test_corners)",
    "/docs/assets/{name}": "Swagger UI's files, the same for everyone",
}
# The console's routes take a session cookie, not a key: tests/console/test_sessions.py
# runs this same check over them with two tenants' sessions.
CONSOLE = "/console"
PARAM = re.compile(r"{(\w+)(?::\w+)?}")


def app_routes(app) -> list[APIRoute]:
    """Every API route, through included routers too."""
    try:
        from fastapi.routing import iter_route_contexts
    except ImportError:  # FastAPI without lazily included routers: the list is flat
        return [r for r in app.routes if isinstance(r, APIRoute)]
    return [c.original_route for c in iter_route_contexts(app.routes)
            if isinstance(c.original_route, APIRoute)]


@pytest.fixture(scope="module")
def tenants(api):
    with api.client("owner-" + uuid.uuid4().hex[:8]) as owner, \
            api.client("intruder-" + uuid.uuid4().hex[:8]) as intruder:
        yield owner, intruder


def test_every_route_is_guarded(api):
    routes = app_routes(api.app)
    assert len(routes) >= 10
    for route in routes:
        assert isinstance(route, GuardedRoute), f"{route.path} bypasses the guard"
    public = {r.path for r in routes if policy_of(r.endpoint).public}
    assert public == {"/healthz", "/readyz", "/v1/objects/{key:path}", "/docs",
                      "/docs/assets/{name}", "/console/static/{name}", "/console/sign-in"}


def id_routes(app) -> tuple[list[tuple[str, list[str], set[str]]], list[str]]:
    """(routes taking tenant ids, with their id params and methods), and the paths whose
    ids this test does not know how to make."""
    covered, untaught = [], []
    for route in app_routes(app):
        params = PARAM.findall(route.path)
        if not params or route.path in NOT_TENANT_SCOPED or route.path.startswith(CONSOLE):
            continue
        if any(p not in MAKE for p in params):
            untaught.append(route.path)
        else:
            covered.append((route.path, params, route.methods))
    return covered, untaught


def test_every_route_with_an_id_is_404_for_another_tenant(api, tenants):
    owner, intruder = tenants
    covered, untaught = id_routes(api.app)
    assert not untaught, f"teach this test how to make the ids of {untaught}"
    checked = []
    for path, params, methods in covered:
        for method in sorted(methods):
            _check(owner, intruder, path, method, params)
            checked.append(f"{method} {path}")
    assert len(checked) >= 6, checked


def test_a_new_route_with_an_unknown_id_is_not_silently_skipped(make_api):
    from fastapi import APIRouter

    extra = APIRouter(route_class=GuardedRoute)
    extra.add_api_route("/v1/things/{thing_id}", lambda thing_id: {}, methods=["GET"])
    app = make_api().app
    app.include_router(extra)
    assert id_routes(app)[1] == ["/v1/things/{thing_id}"]


def _check(owner, intruder, path: str, method: str, params: list[str]) -> None:
    url = path
    for param in params:
        made = MAKE[param](owner)
        assert made.status_code in (200, 202), made.text
        url = url.replace(f"{{{param}}}", made.json()["id"])
    body = BODY.get(path)
    resp = intruder.request(method, url, json=body)
    assert_openai_error(resp, 404, "not_found")
    mine = owner.request(method, url, json=body)
    if path in OWNER_ERRORS:
        assert_openai_error(mine, 400, OWNER_ERRORS[path])
        return
    assert mine.status_code in (200, 409), f"{method} {path}: {mine.status_code} {mine.text}"
