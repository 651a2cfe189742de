"""The webhook API in process (SQLite): submit-time SSRF refusals, per-job subscriptions,
endpoint validation, the default secret and the ``omnijobs webhooks secret`` command."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from api.app import create_app
from core.settings import Settings
from omnijobs.cli import cli
from storage.db import make_engine, make_sessionmaker
from storage.repositories import KeyRepository

from ..integration.helpers import assert_openai_error

SPEECH = {"model": "tts-1", "input": "Hello there.", "response_format": "wav"}


class StubTester:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[str, ...], str]] = []

    def __call__(self, url, secrets, event_type):
        self.calls.append((url, secrets, event_type))
        return (204, None) if "ok" in url else (None, "ConnectError: refused")


@pytest.fixture
def env(tmp_path, sqlite_url, monkeypatch) -> dict[str, str]:
    values = {"OMNIJOBS_DATABASE_URL": sqlite_url, "OMNIJOBS_HOME": str(tmp_path)}
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return values


def make_client(env, tester=None, **settings) -> tuple[TestClient, str]:
    app = create_app(Settings(**settings), publish=lambda _msg: None, webhook_tester=tester)
    _, key = KeyRepository(make_sessionmaker(make_engine(env["OMNIJOBS_DATABASE_URL"]))
                           ).create_key("acme")
    return TestClient(app, headers={"Authorization": f"Bearer {key}",
                                    "Prefer": "respond-async"}), key


def test_production_default_allows_no_private_network():
    assert Settings(mode="embedded").webhook_networks == ["127.0.0.0/8", "::1/128"]
    prod = Settings(mode="production", signing_secret="x" * 20, database_url="postgresql://h/d",
                    broker_url="redis://h", object_store="local")
    assert prod.webhook_networks == []
    with pytest.raises(ValueError):
        Settings(webhook_allowed_networks=["not-a-network"])


@pytest.mark.parametrize(("url", "code"), [
    ("http://localhost:9/h", "webhook_url_loopback"),
    ("http://127.0.0.1:9/h", "webhook_url_loopback"),
    ("http://10.0.0.5/h", "webhook_url_private"),
    ("http://169.254.169.254/latest/meta-data", "webhook_url_cloud_metadata"),
    ("http://100.64.3.4/h", "webhook_url_cgnat"),
    ("http://[ff02::1]/h", "webhook_url_multicast"),
    ("http://[fe80::1]/h", "webhook_url_link_local"),
])
def test_submit_refuses_internal_urls_with_the_reason(env, url, code):
    client, _ = make_client(env, webhook_allowed_networks=[])
    resp = client.post("/v1/audio/speech", json={**SPEECH, "webhook_url": url})
    err = assert_openai_error(resp, 400, code)
    assert err["param"] == "webhook_url" and "refused" in err["message"]
    video = client.post("/v1/videos", json={"prompt": "a boat", "webhook_url": url})
    assert_openai_error(video, 400, code)
    endpoint = client.post("/v1/webhook_endpoints", json={
        "name": "n", "url": url, "event_types": ["video.completed"]})
    assert assert_openai_error(endpoint, 400, code)["param"] == "url"
    assert client.get("/v1/jobs").json()["data"] == []  # nothing half-written


def test_loopback_is_accepted_once_allowed_and_the_job_is_subscribed(env):
    client, _ = make_client(env)  # embedded default: loopback allowed
    job = client.post("/v1/audio/speech", json={
        **SPEECH, "webhook_url": "http://localhost:9/h",
        "webhook_events": ["speech.started", "speech.cancelled"]})
    assert job.status_code == 202, job.text
    client.post(f"/v1/jobs/{job.json()['id']}/cancel")
    [delivery] = client.get(f"/v1/jobs/{job.json()['id']}/webhook_deliveries").json()["data"]
    assert delivery["event_type"] == "speech.cancelled" and delivery["status"] == "pending"
    assert delivery["webhook_endpoint_id"] is None and delivery["attempts"] == []


def test_video_form_takes_webhook_events_as_a_list(env):
    client, _ = make_client(env)
    video = client.post("/v1/videos", data={"prompt": "a boat", "seconds": "1",
                                            "webhook_url": "http://127.0.0.1:9/v",
                                            "webhook_events": "video.cancelled"})
    assert video.status_code == 200, video.text
    client.post(f"/v1/jobs/{video.json()['id']}/cancel")
    log = client.get(f"/v1/videos/{video.json()['id']}/webhook_deliveries").json()["data"]
    assert [d["event_type"] for d in log] == ["video.cancelled"]
    client.delete(f"/v1/videos/{video.json()['id']}")
    assert client.get(f"/v1/videos/{video.json()['id']}/webhook_deliveries").status_code == 404


@pytest.mark.parametrize(("body", "param"), [
    ({"webhook_url": "http://127.0.0.1:9/h", "webhook_events": ["video.completed"]},
     "webhook_events"),
    ({"webhook_url": "http://127.0.0.1:9/h", "webhook_events": ["speech.done"]},
     "webhook_events"),
    ({"webhook_events": ["speech.completed"]}, "webhook_events"),
    ({"webhook_url": "http://127.0.0.1:9/" + "x" * 2100}, "webhook_url"),
])
def test_bad_webhook_fields_are_400(env, body, param):
    client, _ = make_client(env)
    err = assert_openai_error(client.post("/v1/audio/speech", json={**SPEECH, **body}), 400)
    assert err["param"] == param


def test_endpoint_api_validation_and_test_calls(env):
    tester = StubTester()
    client, _ = make_client(env, tester=tester)
    bad = client.post("/v1/webhook_endpoints", json={
        "name": "n", "url": "http://127.0.0.1:9/ok", "event_types": ["response.completed"]})
    assert assert_openai_error(bad, 400, "invalid_event_type")["param"] == "event_types"
    made = client.post("/v1/webhook_endpoints", json={
        "name": "n", "url": "http://127.0.0.1:9/ok", "event_types": ["video.completed"]}).json()
    assert made["signing_secret"].startswith("whsec_")
    assert made["signing_secret_hint"].endswith(made["signing_secret"][-4:])
    assert "signing_secret" not in client.get(f"/v1/webhook_endpoints/{made['id']}").json()
    result = client.post(f"/v1/webhook_endpoints/{made['id']}/test",
                         json={"event_type": "video.completed"}).json()
    assert result == {"object": "webhook_endpoint.test", "status_code": 204, "success": True,
                      "event_type": "video.completed", "webhook_endpoint_id": made["id"]}
    assert tester.calls == [("http://127.0.0.1:9/ok", (made["signing_secret"],),
                             "video.completed")]
    client.post(f"/v1/webhook_endpoints/{made['id']}", json={"url": "http://127.0.0.1:9/no"})
    failed = client.post(f"/v1/webhook_endpoints/{made['id']}/test",
                         json={"event_type": "video.completed"})
    assert "ConnectError" in assert_openai_error(failed, 400, "webhook_test_failed")["message"]
    assert_openai_error(client.get("/v1/webhook_endpoints/we_nope" + "x" * 40), 404)
    assert_openai_error(client.post("/v1/webhook_endpoints", json={
        "name": "n", "url": "http://127.0.0.1:9/ok", "event_types": ["video.completed"],
        "colour": "red"}), 400)
    kinds = client.get("/v1/webhook_event_types").json()["data"]
    assert "speech.completed" in kinds and "batch.expired" in kinds


def test_another_tenant_sees_nothing(env):
    client, _ = make_client(env)
    made = client.post("/v1/webhook_endpoints", json={
        "name": "n", "url": "http://127.0.0.1:9/ok", "event_types": ["video.failed"]}).json()
    _, other_key = KeyRepository(make_sessionmaker(make_engine(
        env["OMNIJOBS_DATABASE_URL"]))).create_key("other")
    other = {"Authorization": f"Bearer {other_key}"}
    assert_openai_error(client.get(f"/v1/webhook_endpoints/{made['id']}", headers=other), 404)
    assert_openai_error(client.delete(f"/v1/webhook_endpoints/{made['id']}", headers=other),
                        404)
    assert client.get("/v1/webhook_endpoints", headers=other).json()["data"] == []


def test_default_secret_command_and_route_agree(env):
    client, _ = make_client(env)
    runner = CliRunner()
    printed = runner.invoke(cli, ["webhooks", "secret", "--tenant", "acme"])
    assert printed.exit_code == 0, printed.output
    secret = printed.output.strip().splitlines()[-1]
    assert secret.startswith("whsec_")
    shown = client.get("/v1/webhooks/default/secret").json()
    assert shown["secret"] == secret and shown["previous_secret_expires_at"] is None
    again = runner.invoke(cli, ["webhooks", "secret", "--tenant", "acme"])
    assert again.output.strip().splitlines()[-1] == secret
    rotated = runner.invoke(cli, ["webhooks", "secret", "--tenant", "acme", "--rotate"])
    new = rotated.output.strip().splitlines()[-1]
    assert new.startswith("whsec_") and new != secret
    shown = client.get("/v1/webhooks/default/secret").json()
    assert shown["secret"] == new
    assert shown["previous_secret_expires_at"] - shown["created_at"] == 24 * 3600
    missing = runner.invoke(cli, ["webhooks", "secret", "--tenant", "nobody"])
    assert missing.exit_code == 1
