"""The console in-process over PostgreSQL (nothing renders here): sign-in, the session
cookie, CSRF, idle expiry, sign-out, revocation, the guard, tenant isolation generated
from the route table, the operator's scope, the security headers and /docs' files."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update

from api.console.actions import actor
from api.console.render import ConsoleRoute
from api.guard import GuardedRoute, policy_of
from core.jobs import JobStatus
from storage.db import make_engine
from storage.models import ConsoleSession
from storage.repositories import KeyRepository

from ..api.conftest import Api
from ..api.test_isolation import PARAM, app_routes
from ..conftest import migrated_database

CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@pytest.fixture(scope="module")
def console_db():
    yield from migrated_database()


@pytest.fixture(scope="module")
def api(console_db, tmp_path_factory):
    built = Api(console_db, tmp_path_factory.mktemp("console-home"))
    yield built
    built.close()


def new_key(api: Api, tenant: str, operator: bool = False) -> str:
    return KeyRepository(api.services.keys._sessions).create_key(tenant, operator)[1]


def browser(api: Api, base_url: str = "http://testserver") -> TestClient:
    return TestClient(api.app, base_url=base_url, follow_redirects=False,
                      raise_server_exceptions=False)


def sign_in(client: TestClient, key: str, next_path: str = "/console"):
    form = client.get("/console/sign-in")
    return client.post("/console/sign-in", data={
        "key": key, "csrf": CSRF.search(form.text).group(1), "next": next_path})


def signed_in(api: Api, key: str) -> TestClient:
    client = browser(api)
    assert sign_in(client, key).status_code == 303
    return client


def csrf_of(client: TestClient, path: str = "/console/jobs") -> str:
    return CSRF.search(client.get(path).text).group(1)


def submit(api: Api, key: str, text: str = "Queued.") -> str:
    resp = api.client(key=key).post("/v1/audio/speech", headers={"Prefer": "respond-async"},
                                    json={"model": "tts-1", "input": text})
    assert resp.status_code == 202, resp.text
    return resp.json()["id"]


def tenant() -> str:
    return "con-" + uuid.uuid4().hex[:8]


def test_sign_in_gives_a_strict_httponly_cookie_and_the_key_stays_out_of_it(api):
    key = new_key(api, tenant())
    client = browser(api)
    form = client.get("/console/sign-in")
    assert "HttpOnly" in form.headers["set-cookie"] and 'type="password"' in form.text
    refused = client.post("/console/sign-in", data={"key": key})  # no form token
    assert refused.status_code == 403 and "omnijobs_console=" not in refused.headers.get(
        "set-cookie", "")
    wrong = sign_in(client, "oj-not-a-key")
    assert wrong.status_code == 401 and "not accepted" in wrong.text
    resp = sign_in(client, key, "/console/jobs")
    assert (resp.status_code, resp.headers["location"]) == (303, "/console/jobs")
    cookie = next(c for c in resp.headers.get_list("set-cookie")
                  if c.startswith("omnijobs_console="))
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/console" in cookie
    assert "Secure" not in cookie and key not in cookie
    secure = browser(api, "https://testserver")
    over_tls = next(c for c in sign_in(secure, key).headers.get_list("set-cookie")
                    if c.startswith("omnijobs_console="))
    assert "Secure" in over_tls


def test_the_key_appears_in_no_page(api):
    key = new_key(api, tenant())
    job_id = submit(api, key)
    client = signed_in(api, key)
    for path in ("/console", "/console/jobs", f"/console/jobs/{job_id}", "/console/batches",
                 "/console/webhooks", "/console/workers", "/console/usage"):
        resp = client.get(path)
        assert resp.status_code == 200, (path, resp.text)
        assert key not in resp.text and key[3:20] not in resp.text, path


def test_without_a_session_pages_go_to_sign_in_and_the_rest_is_401(api):
    client = browser(api)
    page = client.get("/console/jobs?status=queued")
    assert page.status_code == 303
    assert page.headers["location"] == "/console/sign-in?next=%2Fconsole%2Fjobs%3Fstatus%3Dqueued"
    assert client.post("/console/jobs/job_" + "0" * 32 + "/cancel").status_code == 401
    stream = client.get("/console/live/jobs", headers={"accept": "text/event-stream"})
    assert stream.status_code == 401
    forged = browser(api)
    forged.cookies.set("omnijobs_console", "x" * 500)
    assert forged.get("/console").status_code == 303


def test_next_is_only_ever_a_console_path(api):
    key = new_key(api, tenant())
    for target in ("https://elsewhere.example/", "//elsewhere.example/console", "/v1/jobs"):
        assert sign_in(browser(api), key, target).headers["location"] == "/console"


def _age_sessions(api: Api, seconds: float) -> None:
    engine = make_engine(api.db_url)
    try:
        with engine.begin() as conn:
            conn.execute(update(ConsoleSession).values(
                last_seen_at=datetime.now(UTC) - timedelta(seconds=seconds)))
    finally:
        engine.dispose()


def _last_seen(api: Api, client: TestClient) -> datetime:
    from storage.repositories.keys import hash_key

    engine = make_engine(api.db_url)
    try:
        with engine.connect() as conn:
            return conn.execute(select(ConsoleSession.last_seen_at).where(
                ConsoleSession.id == hash_key(client.cookies["omnijobs_console"]))).scalar_one()
    finally:
        engine.dispose()


def test_an_idle_session_ends_and_an_active_one_goes_on(api):
    key = new_key(api, tenant())
    client = signed_in(api, key)
    idle = api.settings.console_idle_s
    _age_sessions(api, idle * 0.9)  # nearly idle too long: still in, and seen again now
    assert client.get("/console/jobs").status_code == 200
    assert _last_seen(api, client) > datetime.now(UTC) - timedelta(seconds=idle / 2)
    _age_sessions(api, idle + 1)
    resp = client.get("/console/jobs")
    assert resp.status_code == 303 and resp.headers["location"].startswith("/console/sign-in")


def test_sign_out_ends_the_session_for_its_cookie_everywhere(api):
    key = new_key(api, tenant())
    client = signed_in(api, key)
    cookie = client.cookies.get("omnijobs_console")
    resp = client.post("/console/sign-out", data={"csrf": csrf_of(client)})
    assert resp.status_code == 303 and 'omnijobs_console=""' in resp.headers["set-cookie"]
    replay = browser(api)
    replay.cookies.set("omnijobs_console", cookie)
    assert replay.get("/console/jobs").status_code == 303


def test_a_revoked_key_ends_its_sessions(api):
    key = new_key(api, tenant())
    client = signed_in(api, key)
    assert client.get("/console/jobs").status_code == 200
    KeyRepository(api.services.keys._sessions).revoke(key[:10])
    assert client.get("/console/jobs").status_code == 303


def test_an_action_needs_the_sessions_csrf_token(api):
    key = new_key(api, tenant())
    other = signed_in(api, new_key(api, tenant()))
    job_id = submit(api, key)
    client = signed_in(api, key)
    url = f"/console/jobs/{job_id}/cancel"
    assert client.post(url).status_code == 403
    assert client.post(url, data={"csrf": csrf_of(other)}).status_code == 403
    assert api.services.jobs.get(job_id).status is JobStatus.QUEUED
    resp = client.post(url, headers={"X-CSRF-Token": csrf_of(client)})
    assert resp.status_code == 303 and resp.headers["location"].endswith("?notice=cancelled")
    assert api.services.jobs.get(job_id).status is JobStatus.CANCELLED


def test_the_guard_checks_the_session_before_the_body_and_caps_forms(api):
    big = b"csrf=" + b"x" * 200_000
    anonymous = browser(api).post("/console/jobs/job_" + "0" * 32 + "/cancel", content=big,
                                  headers={"content-type": "application/x-www-form-urlencoded"})
    assert anonymous.status_code == 401
    client = signed_in(api, new_key(api, tenant()))
    resp = client.post("/console/jobs/job_" + "0" * 32 + "/cancel", content=big,
                       headers={"content-type": "application/x-www-form-urlencoded"})
    assert resp.status_code == 413


def test_every_console_route_is_guarded_by_the_session(api):
    routes = [r for r in app_routes(api.app) if r.path.startswith(("/console", "/docs"))]
    assert len(routes) >= 15
    public = set()
    for route in routes:
        assert isinstance(route, ConsoleRoute) and isinstance(route, GuardedRoute), route.path
        policy = policy_of(route.endpoint)
        if policy.public:
            public.add(route.path)
        else:
            assert policy.authenticate is not None, f"{route.path} takes no session"
        if "POST" in route.methods and route.path != "/console/sign-in":
            assert actor in set(_calls(route.dependant)), f"{route.path} skips the CSRF check"
    assert public == {"/console/sign-in", "/console/static/{name}", "/docs",
                      "/docs/assets/{name}"}


def _calls(dependant):
    yield dependant.call
    for sub in dependant.dependencies:
        yield from _calls(sub)


def _made(api: Api, key: str) -> dict[str, str]:
    """One resource of each kind a console path names, owned by ``key``'s tenant."""
    client = api.client(key=key)
    job = client.post("/v1/audio/speech", headers={"Prefer": "respond-async"}, json={
        "model": "tts-1", "input": "Mine.", "webhook_url": "http://127.0.0.1:9/hook"}).json()
    client.post(f"/v1/jobs/{job['id']}/cancel")
    delivery = client.get(f"/v1/jobs/{job['id']}/webhook_deliveries").json()["data"][0]
    upload = client.post("/v1/files", data={"purpose": "batch"},
                         files={"file": ("mine.jsonl", b"{}\n")}).json()
    batch = client.post("/v1/batches", json={"input_file_id": upload["id"],
                                             "endpoint": "/v1/audio/speech",
                                             "completion_window": "24h"}).json()
    endpoint = client.post("/v1/webhook_endpoints", json={
        "name": "mine", "url": "http://127.0.0.1:9/hook",
        "event_types": ["speech.completed"]}).json()
    return {"job_id": submit(api, key), "delivery_id": delivery["id"], "batch_id": batch["id"],
            "file_id": upload["id"], "endpoint_id": endpoint["id"], "index": "0"}


def test_every_console_route_with_an_id_is_404_to_another_tenant(api):
    owner_key, intruder_key = new_key(api, tenant()), new_key(api, tenant())
    intruder, owner = signed_in(api, intruder_key), signed_in(api, owner_key)
    checked = []
    for route in app_routes(api.app):
        params = PARAM.findall(route.path)
        if not route.path.startswith("/console") or not params or policy_of(
                route.endpoint).public:
            continue
        made = _made(api, owner_key)  # fresh: the route before may have deleted one
        url = route.path
        for param in params:
            url = url.replace(f"{{{param}}}", made[param])
        for method in route.methods:
            data = {"csrf": csrf_of(intruder), "event_type": "speech.completed"}
            resp = intruder.request(method, url, data=data if method == "POST" else None)
            assert resp.status_code == 404, f"{method} {url}: {resp.status_code}"
            mine = owner.request(method, url, data={**data, "csrf": csrf_of(owner)}
                                 if method == "POST" else None)
            assert mine.status_code != 404, f"{method} {url}: {mine.text[:300]}"
            checked.append(f"{method} {route.path}")
    assert len(checked) >= 10, checked


def test_an_operator_sees_every_tenant_and_a_tenant_only_its_own(api):
    a_key, b_key = new_key(api, tenant()), new_key(api, tenant())
    a_job, b_job = submit(api, a_key), submit(api, b_key)
    operator = signed_in(api, new_key(api, tenant(), operator=True))
    page = operator.get("/console/jobs").text
    assert a_job in page and b_job in page and "operator: every tenant" in page
    tenant_a = signed_in(api, a_key)
    page = tenant_a.get("/console/jobs").text
    assert a_job in page and b_job not in page
    b_tenant = api.services.jobs.get(b_job).tenant_id
    assert b_job not in tenant_a.get(f"/console/jobs?tenant={b_tenant}").text
    assert tenant_a.get(f"/console/jobs/{b_job}").status_code == 404
    assert operator.get(f"/console/jobs/{b_job}").status_code == 200
    resp = operator.post(f"/console/jobs/{b_job}/cancel", data={"csrf": csrf_of(operator)})
    assert resp.status_code == 303
    assert api.services.jobs.get(b_job).status is JobStatus.CANCELLED


EXPECTED_CSP = {
    "default-src": ["'none'"], "script-src": ["'self'"], "style-src": ["'self'"],
    "img-src": ["'self'", "data:"], "media-src": ["'self'"], "connect-src": ["'self'"],
    "font-src": ["'self'"], "form-action": ["'self'"], "frame-ancestors": ["'none'"],
    "base-uri": ["'none'"]}


def csp_directives(header: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for part in header.split(";"):
        name, *values = part.split()
        assert name not in found, f"{name} twice in {header}"
        found[name] = values
    return found


def test_pages_and_docs_allow_this_origin_only(api):
    client = signed_in(api, new_key(api, tenant()))
    for path in ("/console/jobs", "/docs", "/console/static/console.js",
                 "/docs/assets/swagger-ui-bundle.js"):
        resp = client.get(path)
        assert resp.status_code == 200, path
        # every directive compared whole: a substring would pass "script-src 'self'
        # 'unsafe-inline'", which lets injected markup run
        assert csp_directives(resp.headers["content-security-policy"]) == EXPECTED_CSP, path
        assert resp.headers["x-frame-options"] == "DENY"
    docs = client.get("/docs").text
    assert not re.search(r'(src|href)="(https?:)?//', docs), docs
    assert client.get("/docs/assets/../../core/settings.py").status_code == 404
    assert client.get("/console/static/nothing.js").status_code == 404


def test_an_expired_batch_file_is_gone_from_the_console_too(api):
    """The console's download reads the same expiry as /v1/files/{id}/content: 410 and
    nothing of the (deleted) content, not a stream of a key that may hold other bytes."""
    from datetime import UTC, datetime, timedelta

    from storage.models import File
    from tasks.retention import expire_files
    from tasks.runtime import WorkerRuntime

    key = new_key(api, tenant())
    client = api.client(key=key)
    upload = client.post("/v1/files", data={"purpose": "batch"},
                         files={"file": ("in.jsonl", b'{"a": 1}\n', "application/jsonl")}
                         ).json()
    batch = client.post("/v1/batches", json={"input_file_id": upload["id"],
                                             "endpoint": "/v1/audio/speech",
                                             "completion_window": "24h"}).json()
    console = signed_in(api, key)
    path = f"/console/batches/{batch['id']}/files/{upload['id']}"
    assert console.get(path).content == b'{"a": 1}\n'
    with api.app.state.engine.begin() as conn:
        conn.execute(update(File).where(File.id == upload["id"]).values(
            expires_at=datetime.now(UTC) - timedelta(seconds=1)))
    expired = console.get(path)
    assert expired.status_code == 410 and b'{"a": 1}' not in expired.content
    expire_files(WorkerRuntime(api.settings))  # the bytes deleted: still a 410, not a 500
    assert console.get(path).status_code == 410
