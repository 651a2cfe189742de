"""One delivery at a time, in process, against a real local receiver: retries keep one
webhook-id, redirects are not followed, timeouts and DNS rebinding fail the attempt."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from functools import partial

import pytest
from celery import Celery
from prometheus_client import REGISTRY

from core.jobs import JobKind
from core.settings import Settings
from storage.db import make_engine, make_sessionmaker
from storage.records import JobWebhookRequest, NewJob, OutputRecord
from storage.repositories import KeyRepository
from storage.repositories.webhooks import default_events
from tasks.deliver import deliver, lock_s, send, send_test
from tasks.runtime import WorkerRuntime

from .receiver import Receiver, Reply, verify


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


# Room for this process's own receiver thread to answer on a loaded machine (at 1 s a
# replay's 200 came too late once on a loaded machine), and still under the slow reply's 3 s.
TIMEOUT_S = 2.5


@pytest.fixture
def rt(tmp_path, sqlite_url) -> WorkerRuntime:
    settings = Settings(database_url=sqlite_url, home=tmp_path,
                        webhook_retry_schedule_s=[0, 0, 0],
                        webhook_timeout_s=TIMEOUT_S, webhook_allowed_networks=["127.0.0.0/8"])
    return WorkerRuntime(settings)


APP = Celery("test", broker="memory://")


def completed_job(rt: WorkerRuntime, url: str) -> tuple[str, str]:
    tenant, _ = KeyRepository(make_sessionmaker(make_engine(rt.settings.db_url))).create_key(
        "t-" + uuid.uuid4().hex)
    job, _ = rt.jobs.create(NewJob(
        tenant_id=tenant, kind=JobKind.SPEECH, model="tts-1", pipeline="piper-joe", queue="q",
        request={"input": "hi"}, metadata={"ref": "r1"}, max_attempts=3,
        webhook=JobWebhookRequest(url, default_events("speech"))))
    rt.jobs.claim(job.id, "w", 60)
    out = OutputRecord(index=0, key=f"{tenant}/{job.id}/0.wav", content_type="audio/wav",
                       bytes=4, sha256="0" * 64, duration_s=1.0, sample_rate=22050, channels=1)
    assert rt.jobs.complete(job.id, 1, [out], 3600)
    return tenant, job.id


def run_due(rt: WorkerRuntime) -> list[str]:
    return [deliver(rt, APP, d, t) for d, t in rt.webhooks.claim_due(lock_s(rt.settings))]


def outcomes(name: str) -> float:
    return REGISTRY.get_sample_value("omnijobs_webhook_deliveries_total",
                                     {"outcome": name}) or 0.0


def latencies() -> float:
    return REGISTRY.get_sample_value("omnijobs_webhook_delivery_latency_seconds_count") or 0.0


def test_fails_twice_then_succeeds_three_attempts_one_webhook_id(rt, receiver):
    receiver.reply("/hook", Reply(500), Reply(503))
    tenant, job_id = completed_job(rt, receiver.url("/hook"))
    before = (outcomes("retrying"), outcomes("succeeded"), latencies())
    results = [run_due(rt) for _ in range(3)]
    assert results == [["retrying"], ["retrying"], ["succeeded"]]
    assert (outcomes("retrying"), outcomes("succeeded"), latencies()) == (
        before[0] + 2, before[1] + 1, before[2] + 1)
    got = receiver.at("/hook")
    assert len(got) == 3 and len({r.headers["webhook-id"] for r in got}) == 1
    secret = rt.webhooks.default_secret(tenant).secret
    event = verify(got[-1], secret)
    assert event["id"] == got[0].headers["webhook-id"] and event["type"] == "speech.completed"
    data = event["data"]
    assert (data["id"], data["object"], data["status"]) == (job_id, "job", "completed")
    assert data["metadata"] == {"ref": "r1"} and data["outputs"][0]["url"].startswith("http")
    [log] = rt.webhooks.deliveries_for_job(tenant, job_id)
    assert log.status == "succeeded" and log.next_attempt_at is None
    assert [a.status_code for a in log.attempts] == [500, 503, 200]
    assert all(a.url_host == f"127.0.0.1:{receiver.port}" for a in log.attempts)
    assert run_due(rt) == []


def test_redirects_are_not_followed(rt, receiver):
    receiver.reply("/moved", Reply(302, {"location": receiver.url("/elsewhere")}))
    tenant, job_id = completed_job(rt, receiver.url("/moved"))
    assert run_due(rt) == ["retrying"]
    assert receiver.at("/elsewhere") == []
    [log] = rt.webhooks.deliveries_for_job(tenant, job_id)
    assert log.attempts[0].status_code == 302 and log.status == "pending"


def test_gives_up_when_the_schedule_runs_out(rt, receiver):
    receiver.reply("/down", Reply(500), Reply(500), Reply(500))
    tenant, job_id = completed_job(rt, receiver.url("/down"))
    assert [run_due(rt) for _ in range(3)] == [["retrying"], ["retrying"], ["failed"]]
    [log] = rt.webhooks.deliveries_for_job(tenant, job_id)
    assert log.status == "failed" and len(log.attempts) == 3 and run_due(rt) == []


def test_a_slow_receiver_times_out(rt, receiver):
    """It answers 200 after 3 s: inside any default client timeout, outside the 2.5 s the
    settings allow, so only the configured timeout can fail this attempt."""
    receiver.reply("/slow", Reply(200, delay_s=3.0))
    tenant, job_id = completed_job(rt, receiver.url("/slow"))
    assert run_due(rt) == ["retrying"]
    [log] = rt.webhooks.deliveries_for_job(tenant, job_id)
    assert log.attempts[0].status_code is None and "timed out" in log.attempts[0].error


def test_a_trickling_receiver_is_cut_at_the_deadline(rt, receiver):
    """A header byte every 0.5 s never trips a 2.5 s timeout per read; the attempt's own
    deadline must end it, and close the socket (the receiver sees the hang-up)."""
    receiver.reply("/trickle", Reply(200, trickle_s=0.5))
    tenant, job_id = completed_job(rt, receiver.url("/trickle"))
    assert run_due(rt) == ["retrying"]
    [log] = rt.webhooks.deliveries_for_job(tenant, job_id)
    assert log.attempts[0].status_code is None and "timed out" in log.attempts[0].error
    assert receiver.hung_up("/trickle")


def test_a_flood_of_headers_fails_the_attempt(rt, receiver):
    receiver.reply("/flood", Reply(200, flood_bytes=4 << 20))
    tenant, job_id = completed_job(rt, receiver.url("/flood"))
    assert run_due(rt) == ["retrying"]
    [log] = rt.webhooks.deliveries_for_job(tenant, job_id)
    assert log.attempts[0].status_code is None and log.attempts[0].error


def test_the_endpoint_test_is_bounded_the_same_way(rt, receiver):
    receiver.reply("/trickle-test", Reply(200, trickle_s=0.5))
    code, error = send_test(rt.settings, receiver.url("/trickle-test"), ("whsec_" + "A" * 44,),
                            "speech.completed")
    assert code is None and "timed out" in error
    assert receiver.hung_up("/trickle-test")


def test_an_internationalised_host_is_sent_idna_encoded(rt, receiver):
    asked: list[str] = []

    def resolve(host: str, port: int) -> list[str]:
        asked.append(host)
        return ["127.0.0.1"]
    url = f"http://bücher.example:{receiver.port}/idn"
    result = send(url, json.dumps({"id": "evt_x"}), {}, rt.settings, resolver=resolve)
    assert result.status_code == 200, result
    assert asked == ["xn--bcher-kva.example"]
    [got] = receiver.at("/idn")
    assert got.headers["host"] == f"xn--bcher-kva.example:{receiver.port}"


def test_an_internationalised_webhook_url_is_delivered(rt, receiver, monkeypatch):
    # the name resolves nowhere here: the attempt resolves it to the receiver
    monkeypatch.setattr("tasks.deliver.send", partial(
        send, resolver=lambda host, port: ["127.0.0.1"] if host.startswith("xn--") else []))
    tenant, job_id = completed_job(rt, f"http://bücher.example:{receiver.port}/idn-job")
    assert run_due(rt) == ["succeeded"]
    [log] = rt.webhooks.deliveries_for_job(tenant, job_id)
    assert [a.status_code for a in log.attempts] == [200]


def test_any_error_in_an_attempt_is_a_recorded_failure(rt, receiver, monkeypatch):
    def broken(*_args, **_kwargs):
        raise RuntimeError("a bug while sending")
    monkeypatch.setattr("tasks.deliver.signed_headers", broken)
    tenant, job_id = completed_job(rt, receiver.url("/never"))
    assert run_due(rt) == ["retrying"]
    [log] = rt.webhooks.deliveries_for_job(tenant, job_id)
    assert log.attempts[0].status_code is None and "RuntimeError" in log.attempts[0].error
    assert receiver.at("/never") == []


def test_dns_rebinding_is_refused_at_delivery(rt, receiver):
    """The name passed at submit; at delivery it resolves to the metadata service."""
    body = json.dumps({"id": "evt_x"})
    result = send(receiver.url("/hook").replace("127.0.0.1", "hooks.test"), body, {},
                  rt.settings, resolver=lambda host, port: ["169.254.169.254"])
    assert result.status_code is None and "cloud-metadata" in result.error
    result = send(receiver.url("/hook").replace("127.0.0.1", "hooks.test"), body, {},
                  rt.settings, resolver=lambda host, port: ["127.0.0.1"])
    assert result.status_code == 200  # the checked address is the one connected to
    [got] = receiver.at("/hook")
    assert got.headers["host"] == f"hooks.test:{receiver.port}"


def test_a_deleted_job_is_reported_by_id(rt, receiver):
    tenant, job_id = completed_job(rt, receiver.url("/gone"))
    assert rt.jobs.delete(job_id, tenant)
    assert run_due(rt) == ["succeeded"]
    event = verify(receiver.at("/gone")[0], rt.webhooks.default_secret(tenant).secret)
    assert event["data"] == {"id": job_id, "object": "job", "deleted": True}
    assert event["created_at"] <= datetime.now(UTC).timestamp()


def test_deliveries_share_one_tls_context(rt, receiver, monkeypatch):
    """Each delivery has a client of its own, but none builds a TLS context again: that
    loads the CA bundle (34 ms of CPU), once per process is enough."""
    import ssl

    loads: list[object] = []
    real = ssl.SSLContext.load_verify_locations
    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations",
                        lambda self, *a, **k: loads.append(a or k) or real(self, *a, **k))
    for i in range(3):
        result = send(receiver.url(f"/tls{i}"), json.dumps({"id": f"evt_{i}"}), {},
                      rt.settings)
        assert result.status_code == 200, result
    assert len(loads) <= 1, f"{len(loads)} CA bundle loads for 3 deliveries"
