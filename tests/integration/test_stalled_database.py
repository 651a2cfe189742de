"""A database that stalls (a proxy that stops forwarding: the kernel takes what is sent
and nothing comes back, so no socket error ever arrives) is an outage with a bound, not
a hang: every API route that needs the database answers 503 with Retry-After and frees
its thread, the API recovers by itself once the database answers again, and a worker
whose heartbeat cannot be confirmed within its lease treats the job as lost, so its
upload guard never passes on a guess."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import pytest

from core.settings import Settings
from pipelines import get_spec
from storage.db import make_engine, make_sessionmaker
from storage.records import NewJob
from storage.repositories import JobRepository, KeyRepository
from tasks.lease import Lease
from tasks.runtime import WorkerRuntime

from ..api.conftest import Api
from ..proxy import Proxy, through
from ..services import outcome, wait_until

BOUNDS = {"db_statement_timeout_s": 0.5, "db_task_statement_timeout_s": 0.5,
          "db_connect_timeout_s": 2, "db_pool_timeout_s": 1.0}
DEADLINE_S = 30.0  # far past every bound above, and far short of "for ever"
JOB, VIDEO = "job_" + "0" * 32, "video_" + "0" * 32
FILE, BATCH, ENDPOINT = "file-" + "0" * 32, "batch_" + "0" * 32, "we_" + "0" * 32
HOOK = "https://93.184.216.34/hook"  # a public literal address: no DNS lookup

# Every route that reads or writes the database, with a request it would accept.
REQUESTS: list[tuple[str, str, dict]] = [
    ("POST", "/v1/audio/speech", {"json": {"model": "tts-1", "input": "Hello."},
                                  "headers": {"Prefer": "respond-async"}}),
    ("POST", "/v1/audio/speech", {"json": {"model": "tts-1", "input": "Hello."}}),
    ("POST", "/v1/videos", {"json": {"model": "sora-2", "prompt": "A cat."}}),
    ("GET", "/v1/videos", {}), ("GET", f"/v1/videos/{VIDEO}", {}),
    ("DELETE", f"/v1/videos/{VIDEO}", {}), ("GET", f"/v1/videos/{VIDEO}/content", {}),
    ("GET", f"/v1/videos/{VIDEO}/events", {}),
    ("GET", f"/v1/videos/{VIDEO}/webhook_deliveries", {}),
    ("GET", "/v1/jobs", {}), ("GET", f"/v1/jobs/{JOB}", {}),
    ("POST", f"/v1/jobs/{JOB}/cancel", {}), ("GET", f"/v1/jobs/{JOB}/content", {}),
    ("GET", f"/v1/jobs/{JOB}/events", {}), ("GET", f"/v1/jobs/{JOB}/webhook_deliveries", {}),
    ("POST", "/v1/files", {"data": {"purpose": "batch"}, "files": {"file": (
        "in.jsonl", b'{"custom_id": "a", "method": "POST", "url": "/v1/audio/speech", '
        b'"body": {"model": "tts-1", "input": "Hi."}}\n')}}),
    ("GET", "/v1/files", {}), ("GET", f"/v1/files/{FILE}", {}),
    ("DELETE", f"/v1/files/{FILE}", {}), ("GET", f"/v1/files/{FILE}/content", {}),
    ("POST", "/v1/batches", {"json": {"input_file_id": FILE, "endpoint": "/v1/audio/speech",
                                      "completion_window": "24h"}}),
    ("GET", "/v1/batches", {}), ("GET", f"/v1/batches/{BATCH}", {}),
    ("POST", f"/v1/batches/{BATCH}/cancel", {}),
    ("POST", "/v1/webhook_endpoints", {"json": {"name": "hook", "url": HOOK,
                                                "event_types": ["video.completed"]}}),
    ("GET", "/v1/webhook_endpoints", {}), ("GET", f"/v1/webhook_endpoints/{ENDPOINT}", {}),
    ("POST", f"/v1/webhook_endpoints/{ENDPOINT}", {"json": {"url": HOOK + "2"}}),
    ("DELETE", f"/v1/webhook_endpoints/{ENDPOINT}", {}),
    ("POST", f"/v1/webhook_endpoints/{ENDPOINT}/rotate_secret", {}),
    ("POST", f"/v1/webhook_endpoints/{ENDPOINT}/test",
     {"json": {"event_type": "video.completed"}}),
    ("GET", "/v1/webhooks/default/secret", {}),
    ("GET", "/readyz", {}),
]


@pytest.fixture
def proxy(pg_url) -> Iterator[Proxy]:
    made = Proxy(urlsplit(pg_url).port)
    yield made
    made.close()


def test_every_route_answers_503_while_the_database_stalls(pg_url, proxy, tmp_path):
    tenant = "stall-" + uuid.uuid4().hex[:8]
    engine = make_engine(pg_url)
    key = KeyRepository(make_sessionmaker(engine)).create_key(tenant)[1]
    engine.dispose()
    app = Api(through(pg_url, proxy), tmp_path, auth_cache_ttl_s=10, **BOUNDS)
    def send(request: tuple[str, str, dict]):
        method, path, kwargs = request
        return client.request(method, path, **kwargs)

    try:
        with app.client(key=key) as client, ThreadPoolExecutor(8) as pool:
            assert client.get("/v1/jobs").status_code == 200  # the key is cached now
            proxy.stall()
            try:
                answers = outcome(lambda: list(pool.map(send, REQUESTS)), DEADLINE_S,
                                  "a request to a stalled database")
            finally:
                proxy.restore()  # (whatever still waits goes on, so the test can end)
            assert not isinstance(answers, Exception), answers
            for (method, path, _), resp in zip(REQUESTS, answers, strict=True):
                assert resp.status_code == 503, (method, path, resp.text)
                assert int(resp.headers["retry-after"]) >= 1, (method, path)
                if path != "/readyz":
                    assert resp.json()["error"]["code"] == "service_unavailable"
            wait_until(lambda: client.get("/v1/jobs").status_code == 200, DEADLINE_S,
                       "the API after the database came back")
    finally:
        app.close()


def running_job(pg_url: str, lease_s: float):
    engine = make_engine(pg_url)
    sessions = make_sessionmaker(engine)
    tenant = KeyRepository(sessions).create_key("lease-" + uuid.uuid4().hex[:8])[0]
    spec = get_spec("piper-joe")
    jobs = JobRepository(sessions)
    job, _ = jobs.create(NewJob(tenant_id=tenant, kind=spec.kind, model="tts-1",
                                pipeline=spec.name, queue=spec.queue,
                                request={"input": "Hi."}, metadata=None, max_attempts=3))
    claimed = jobs.claim(job.id, "test-worker", lease_s)
    engine.dispose()
    return claimed


@pytest.mark.parametrize("fault", ["stall", "cut"])
def test_a_lease_that_cannot_be_confirmed_is_lost(pg_url, proxy, tmp_path, fault):
    """The upload guard (``lost_now``) passes only on a confirmed heartbeat; one that
    hangs or fails past the lease means lost, and so does the heartbeat thread. (The
    workers' statement bound stays at its default of minutes: a heartbeat waits no
    longer than its lease has left.)"""
    settings = Settings(mode="embedded", home=tmp_path, database_url=through(pg_url, proxy),
                        db_connect_timeout_s=2)
    rt = WorkerRuntime(settings)
    job = running_job(pg_url, lease_s=1.5)
    guard = Lease(rt.jobs, job.id, job.attempts, lease_s=1.5)
    background = Lease(rt.jobs, job.id, job.attempts, lease_s=1.5).start()
    try:
        assert guard.lost_now() is False  # confirmed
        getattr(proxy, fault)()
        assert outcome(guard.lost_now, DEADLINE_S, "the upload guard") is True
        wait_until(background.lost.is_set, DEADLINE_S, "the heartbeat to give the job up")
    finally:
        proxy.close()
        background.stop()
