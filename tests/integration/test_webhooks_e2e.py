"""Webhooks end to end: real API, render worker and delivery worker processes over
PostgreSQL, Redis and SeaweedFS, delivering to a real local HTTP receiver; every delivery
is verified with the standardwebhooks package and the openai SDK."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import httpx
import pytest
from openai import OpenAI

from ..conftest import migrated_database, stack_env
from ..services import Stack, free_port, redis_url, spawn, wait_until
from ..webhooks.receiver import Receiver, Reply, verify
from .helpers import TERMINAL, wait_job

RENDERED = ["piper-joe", "reference-t2va", "test-silent", "test-video"]
TERMINAL_EVENTS = [f"{k}.{e}" for k in ("speech", "video")
                   for e in ("completed", "failed", "cancelled")]


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def start_delivery_worker(st: Stack, name: str) -> None:
    """The maintenance process: it schedules deliveries and consumes the webhooks queue."""
    proc = spawn(name, ["maintenance"], st.env, st.processes["api"].log.parent)
    st.processes["deliveries"] = proc
    wait_until(lambda: "ready" in proc.log.read_text(), 60, name)


@pytest.fixture(scope="module")
def hooks_stack(seaweedfs, tmp_path_factory) -> Iterator[Stack]:
    home = tmp_path_factory.mktemp("hooks-stack")
    db = migrated_database()
    env = stack_env(next(db), redis_url(), seaweedfs, home,
                    OMNIJOBS_WEBHOOK_ALLOWED_NETWORKS='["127.0.0.0/8"]',
                    OMNIJOBS_WEBHOOK_RETRY_SCHEDULE_S="[0, 0.5, 0.5, 0.5]",
                    # Room for a receiver in a busy test process to answer, so a slow
                    # answer is not taken for a failure and sent again; and for a link
                    # to stay valid while the test reads the other events first.
                    OMNIJOBS_WEBHOOK_TIMEOUT_S="5", OMNIJOBS_SIGNED_URL_TTL_S="300")
    port = free_port()
    st = Stack(base_url=f"http://127.0.0.1:{port}", env=env)
    try:
        st.processes["api"] = spawn("api", ["api", "--port", str(port)], env, home)
        st.processes["render"] = spawn(
            "render", ["worker", *(a for p in RENDERED for a in ("--pipeline", p))], env, home)
        start_delivery_worker(st, "deliveries")
        wait_until(lambda: httpx.get(f"{st.base_url}/readyz", timeout=2).status_code == 200,
                   60, "API")
        wait_until(lambda: "ready" in st.processes["render"].log.read_text(), 90, "render")
        yield st
    finally:
        st.stop()
        next(db, None)


@pytest.fixture(scope="module")
def key(hooks_stack) -> str:
    return hooks_stack.new_key("hooks")


@pytest.fixture(scope="module")
def client(hooks_stack, key) -> Iterator[httpx.Client]:
    with hooks_stack.client(key) as c:
        yield c


def cancelled_job(client: httpx.Client, url: str, **extra) -> str:
    """A job no worker here serves (test-slow): cancelled while queued, at once."""
    job = client.post("/v1/audio/speech", headers={"Prefer": "respond-async"}, json={
        "model": "test-slow", "input": "never rendered", "webhook_url": url, **extra})
    assert job.status_code == 202, job.text
    assert client.post(f"/v1/jobs/{job.json()['id']}/cancel").json()["status"] == "cancelled"
    return job.json()["id"]


def deliveries(client: httpx.Client, job_id: str, until=lambda log: True) -> list[dict]:
    log: list[dict] = []

    def settled() -> bool:
        nonlocal log
        log = client.get(f"/v1/jobs/{job_id}/webhook_deliveries").json()["data"]
        return until(log)

    wait_until(settled, 30, f"delivery log of {job_id}")
    return log


def without_urls(resource: dict) -> dict:
    outputs = [{k: v for k, v in o.items() if k not in ("url", "url_expires_at")}
               for o in resource.get("outputs", [])]
    return {**resource, "outputs": outputs}


def submit_each_outcome(client: httpx.Client, receiver: Receiver) -> dict[str, str]:
    """Completed, failed and cancelled speech and video jobs, each with its own URL."""
    def post(path: str, label: str, body: dict) -> str:
        headers = {"Prefer": "respond-async"}
        resp = client.post(path, headers=headers, json={
            **body, "webhook_url": receiver.url(f"/job/{label}")})
        assert resp.status_code in (200, 202), resp.text
        return resp.json()["id"]

    jobs = {
        "speech.completed": post("/v1/audio/speech", "speech.completed", {
            "model": "tts-1", "input": "Your report is ready.", "response_format": "wav"}),
        "speech.failed": post("/v1/audio/speech", "speech.failed", {
            "model": "test-silent", "input": "silence"}),
        "speech.cancelled": post("/v1/audio/speech", "speech.cancelled", {
            "model": "test-slow", "input": "never rendered"}),
        "video.completed": post("/v1/videos", "video.completed", {
            "model": "sora-2", "prompt": "A lighthouse at dusk", "seconds": 1,
            "size": "128x72", "fps": 12}),
        "video.failed": post("/v1/videos", "video.failed", {
            "model": "test-video", "prompt": "av-mismatch"}),
        "video.cancelled": post("/v1/videos", "video.cancelled", {
            "model": "test-video-slow", "prompt": "ok"}),
    }
    for kind in ("speech", "video"):
        client.post(f"/v1/jobs/{jobs[kind + '.cancelled']}/cancel")
    for job_id in jobs.values():
        assert wait_job(client, job_id, timeout=90)["status"] in TERMINAL
    return jobs


def test_each_outcome_reaches_its_job_url_and_the_registered_endpoint(
        hooks_stack, key, client, receiver):
    sdk = OpenAI(base_url=f"{hooks_stack.base_url}/v1", api_key=key, max_retries=0)
    endpoint = sdk.webhooks.create(name="everything", url=receiver.url("/registered"),
                                   event_types=TERMINAL_EVENTS)
    default_secret = client.get("/v1/webhooks/default/secret").json()["secret"]
    jobs = submit_each_outcome(client, receiver)
    registered = {}
    for got in receiver.wait_for("/registered", 6):
        event = verify(got, endpoint.signing_secret)
        registered[event["type"]] = (got, event)
    assert sorted(registered) == sorted(TERMINAL_EVENTS)
    for event_type, job_id in jobs.items():
        [got] = receiver.wait_for(f"/job/{event_type}")
        event = verify(got, default_secret)
        assert sdk.webhooks.unwrap(got.body, got.headers, secret=default_secret).id == event["id"]
        assert event["type"] == event_type and event["object"] == "event"
        assert got.headers["webhook-id"] == event["id"] == registered[event_type][1]["id"]
        kind = event_type.split(".")[0]
        current = client.get(f"/v1/{'videos' if kind == 'video' else 'jobs'}/{job_id}").json()
        assert list(event["data"])[0] == "id"
        assert without_urls(event["data"]) == without_urls(current)
        assert registered[event_type][1]["data"]["id"] == job_id
        if event_type.endswith("completed"):
            url = event["data"]["outputs"][0]["url"]
            assert httpx.get(url, timeout=30).status_code == 200  # signed, fresh
        if event_type.endswith("failed"):
            assert event["data"]["error"]["code"]
    print("one delivery:", json.dumps(dict(registered["video.completed"][0].headers)),
          registered["video.completed"][0].body.decode(), sep="\n")
    assert sdk.webhooks.delete(endpoint.id).deleted


def test_a_receiver_that_fails_twice_gets_three_attempts_with_one_webhook_id(
        client, receiver):
    receiver.reply("/flaky", Reply(500), Reply(502))
    job_id = cancelled_job(client, receiver.url("/flaky"))
    got = receiver.wait_for("/flaky", 3)
    assert len({r.headers["webhook-id"] for r in got}) == 1
    secret = client.get("/v1/webhooks/default/secret").json()["secret"]
    assert verify(got[-1], secret)["data"]["id"] == job_id
    [log] = deliveries(client, job_id, lambda log: log and log[0]["status"] == "succeeded")
    assert [a["status_code"] for a in log["attempts"]] == [500, 502, 200]
    assert log["attempts"][0]["next_attempt_at"] is not None
    assert log["attempts"][-1]["next_attempt_at"] is None and log["next_attempt_at"] is None
    assert log["event_id"] == got[0].headers["webhook-id"]
    print("delivery log:", json.dumps(log, indent=1))


def test_410_stops_a_job_url_and_disables_an_endpoint(hooks_stack, client, receiver):
    receiver.reply("/gone", Reply(410))
    job_id = cancelled_job(client, receiver.url("/gone"))
    [log] = deliveries(client, job_id, lambda log: log and log[0]["status"] != "pending")
    assert log["status"] == "stopped" and [a["status_code"] for a in log["attempts"]] == [410]
    assert log["next_attempt_at"] is None and len(receiver.at("/gone")) == 1

    receiver.reply("/gone-endpoint", Reply(410))
    endpoint = client.post("/v1/webhook_endpoints", json={
        "name": "gone", "url": receiver.url("/gone-endpoint"),
        "event_types": ["speech.cancelled"]}).json()
    first = cancelled_job(client, receiver.url("/ok-410"))
    deliveries(client, first, lambda log: all(d["status"] != "pending" for d in log))
    assert client.get(f"/v1/webhook_endpoints/{endpoint['id']}").json()["disabled_at"]
    second = cancelled_job(client, receiver.url("/ok-410"))
    log = deliveries(client, second, lambda log: log and log[0]["status"] == "succeeded")
    assert [d["webhook_endpoint_id"] for d in log] == [None]  # the endpoint gets no more
    assert len(receiver.at("/gone-endpoint")) == 1
    client.delete(f"/v1/webhook_endpoints/{endpoint['id']}")


def test_retry_after_is_honoured(client, receiver):
    receiver.reply("/busy", Reply(503, {"Retry-After": "2"}))
    job_id = cancelled_job(client, receiver.url("/busy"))
    first, second = receiver.wait_for("/busy", 2)
    assert second.at - first.at >= 2.0  # the schedule alone would retry after ~0.5 s
    [log] = deliveries(client, job_id, lambda log: log and log[0]["status"] == "succeeded")
    attempt = log["attempts"][0]
    assert attempt["status_code"] == 503
    assert attempt["next_attempt_at"] - attempt["attempted_at"] >= 1


def test_openai_sdk_endpoint_calls_and_rotation(hooks_stack, receiver):
    key = hooks_stack.new_key("hooks-sdk")
    sdk = OpenAI(base_url=f"{hooks_stack.base_url}/v1", api_key=key, max_retries=0)
    made = sdk.webhooks.create(name="sdk", url=receiver.url("/sdk"),
                               event_types=["speech.cancelled"])
    assert made.object == "webhook_endpoint" and made.signing_secret.startswith("whsec_")
    assert made.signing_secret_hint.endswith(made.signing_secret[-4:])
    assert sdk.webhooks.retrieve(made.id).url == receiver.url("/sdk")
    assert [e.id for e in sdk.webhooks.list()] == [made.id]
    updated = sdk.webhooks.update(made.id, name="renamed",
                                  event_types=["speech.cancelled", "video.completed"])
    assert updated.name == "renamed" and updated.event_types[1] == "video.completed"
    result = sdk.webhooks.test(made.id, event_type="video.completed")
    assert (result.status_code, result.success, result.webhook_endpoint_id) == (
        200, True, made.id)
    sample = verify(receiver.wait_for("/sdk")[0], made.signing_secret)
    assert sample["type"] == "video.completed"

    rotated = sdk.webhooks.rotate_secret(made.id, keep_old_secret_active_for_24_hours=True)
    assert rotated.signing_secret != made.signing_secret
    with hooks_stack.client(key) as c:
        cancelled_job(c, receiver.url("/sdk-job"))
    got = receiver.wait_for("/sdk", 2)[-1]
    assert len(got.headers["webhook-signature"].split(" ")) == 2
    assert verify(got, rotated.signing_secret)["id"] == verify(got, made.signing_secret)["id"]
    final = sdk.webhooks.rotate_secret(made.id)  # the old one stops at once
    assert final.signing_secret not in (rotated.signing_secret, made.signing_secret)
    assert sdk.webhooks.delete(made.id).deleted
    assert list(sdk.webhooks.list()) == []


def test_default_secret_rotation_from_the_command_line(hooks_stack, client, receiver):
    old = hooks_stack.cli("webhooks", "secret", "--tenant", "hooks").splitlines()[-1]
    assert old == client.get("/v1/webhooks/default/secret").json()["secret"]
    new = hooks_stack.cli("webhooks", "secret", "--tenant", "hooks",
                          "--rotate").splitlines()[-1]
    cancelled_job(client, receiver.url("/rotated"))
    [got] = receiver.wait_for("/rotated")
    assert len(got.headers["webhook-signature"].split(" ")) == 2
    assert verify(got, new)["id"] == verify(got, old)["id"]


def test_killed_delivery_worker_loses_no_event(hooks_stack, client, receiver):
    """The worker dies while the receiver holds its request; a fresh worker delivers the
    same event (same webhook-id) once the dead one's lock expires."""
    held = threading.Event()
    receiver.reply("/held", Reply(200, hold=held))
    try:
        job_id = cancelled_job(client, receiver.url("/held"))
        [first] = receiver.wait_for("/held")
        hooks_stack.processes["deliveries"].proc.kill()  # its child dies with it
        hooks_stack.processes["deliveries"].proc.wait(10)
        start_delivery_worker(hooks_stack, "deliveries-2")
        again = receiver.wait_for("/held", 2, timeout=60)[1]
    finally:
        held.set()
    assert again.headers["webhook-id"] == first.headers["webhook-id"]
    [log] = deliveries(client, job_id, lambda log: log and log[0]["status"] == "succeeded")
    assert log["event_id"] == first.headers["webhook-id"]
