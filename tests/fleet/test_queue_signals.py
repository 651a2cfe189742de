"""Queue signals: the repository's numbers on both backends, the partial indexes that make
them cheap on PostgreSQL, and the maintenance process's gauges matching the database
while jobs are being submitted."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from sqlalchemy import text, update

from core.batches import BatchStatus
from core.jobs import JobKind
from storage.db import make_engine, make_sessionmaker
from storage.models import Job
from storage.records import BatchLine, NewJob
from storage.repositories import (
    BatchRepository,
    JobRepository,
    KeyRepository,
    QueueRepository,
    WorkerRepository,
)
from storage.repositories.queues import _queued

from ..conftest import migrated_database
from ..services import wait_until
from .conftest import FleetStack, sample, scrape, submit


def new_job(tenant: str, pipeline: str) -> NewJob:
    return NewJob(tenant_id=tenant, kind=JobKind.SPEECH, model="m", pipeline=pipeline,
                  queue=f"pipeline.{pipeline}", request={"input": "x"}, metadata=None,
                  max_attempts=3)


@pytest.fixture
def repos(db_url):
    sessions = make_sessionmaker(make_engine(db_url))
    tenant, _ = KeyRepository(sessions).create_key("t-" + uuid.uuid4().hex)
    return sessions, tenant


def test_signals_count_each_lane_of_each_pipeline(repos):
    sessions, tenant = repos
    jobs, batches = JobRepository(sessions), BatchRepository(sessions)
    a, b, idle = (f"p-{uuid.uuid4().hex[:8]}" for _ in range(3))
    ids = [jobs.create(new_job(tenant, a))[0].id for _ in range(4)]
    claimed = jobs.claim(ids[0], "w", 60)
    jobs.claim(ids[1], "w", 60)
    assert jobs.complete(ids[1], 1, [], 3600)
    old = datetime.now(UTC) - timedelta(seconds=100)
    with sessions.begin() as s:  # the oldest waiting job was submitted 100 s ago
        s.execute(update(Job).where(Job.id == ids[2]).values(created_at=old))
    batch = batches.create(tenant, endpoint="/v1/audio/speech", input_file_id="file-x",
                           completion_window="24h", metadata=None, max_active=10)
    token = batches.take(batch.id, BatchStatus.VALIDATING, 60)
    batches.expand(batch.id, token, (BatchLine(i, f"c{i}", job=new_job(tenant, b))
                                     for i in range(5)))

    signals = QueueRepository(sessions).signals([a, b, idle], window_s=300)
    lanes = {(x.pipeline, x.lane): x for x in signals.lanes}
    assert (lanes[a, "interactive"].queued, lanes[a, "bulk"].queued) == (2, 0)
    assert lanes[a, "interactive"].oldest_queued_at == old
    assert lanes[a, "interactive"].completed == 1 and lanes[a, "bulk"].completed == 0
    assert (lanes[b, "interactive"].queued, lanes[b, "bulk"].queued) == (0, 5)
    assert lanes[b, "bulk"].oldest_queued_at is not None
    assert all(lanes[idle, lane].queued == 0 and lanes[idle, lane].oldest_queued_at is None
               for lane in ("interactive", "bulk"))
    assert (signals.running[a], signals.running[b], signals.running[idle]) == (1, 0, 0)
    assert claimed is not None


def test_the_queued_counts_read_their_partial_indexes():
    """With a long history of finished jobs and a few queued ones, each lane's count is a
    scan of its partial index (the queued jobs alone), whose cost follows the queue."""
    db = migrated_database()
    url = next(db)
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text(
                "INSERT INTO tenants (id, name, created_at) VALUES ('t', 't', now());"
                "INSERT INTO batches (id, tenant_id, endpoint, input_file_id, "
                "completion_window, status, total, completed, failed, rejected, created_at, "
                "expires_at) VALUES ('b', 't', '/v1/audio/speech', 'f', '24h', "
                "'in_progress', 0, 0, 0, 0, now(), now());"
                "INSERT INTO jobs (id, tenant_id, kind, model, pipeline, status, progress, "
                "request, attempts, max_attempts, created_at, updated_at, batch_id) "
                "SELECT 'job_' || i, 't', 'speech', 'm', 'p' || (i % 4), "
                "CASE WHEN i % 1000 = 0 THEN 'queued' ELSE 'completed' END, 0, '{}', 1, 3, "
                "now(), now(), CASE WHEN i % 2 = 0 THEN 'b' END "
                "FROM generate_series(1, 40000) AS i; ANALYZE jobs"))
        with engine.connect() as conn:
            # Jobs of no batch have a tight range in ix_jobs_batch_status too (batch_id
            # NULL, then status), and the fair claim's and the stale sweep's partial
            # indexes hold queued jobs only: any of them reads the queued jobs alone.
            queued_only = ("ix_jobs_queued_updated", "ix_jobs_queued_token")
            for lane, indexes in (("interactive", ("ix_jobs_queued_interactive",
                                                   "ix_jobs_fair_interactive",
                                                   "ix_jobs_batch_status", *queued_only)),
                                  ("bulk", ("ix_jobs_queued_bulk", "ix_jobs_fair_bulk",
                                            *queued_only))):
                sql = str(_queued(lane).compile(engine, compile_kwargs={"literal_binds": True}))
                plan = "\n".join(r[0] for r in conn.execute(text("EXPLAIN " + sql)))
                assert "Seq Scan" not in plan and any(i in plan for i in indexes), plan
    finally:
        engine.dispose()
        next(db, None)


def test_the_gauges_match_the_database_while_jobs_arrive(fleet: FleetStack):
    """Jobs keep arriving for a pipeline no worker serves; each scrape's depth lies
    between the database's counts just before and just after it, and once the
    submitting stops, every gauge equals the database exactly."""
    pipeline = "test-stuck"  # enabled, and no worker of this stack serves it
    depth = ("omnijobs_queue_depth", {"pipeline": pipeline, "lane": "interactive"})
    submitted: list[str] = []
    failures: list[BaseException] = []  # a sender that dies says why, not "130 == 150"
    stop = threading.Event()

    def queued_in_db() -> int:
        return fleet.sql("SELECT count(*) FROM jobs WHERE pipeline = :p AND status = 'queued'",
                         p=pipeline)[0]

    key = fleet.new_key("gauges")
    with fleet.client(key) as c:
        def load() -> None:
            try:
                while not stop.is_set() and len(submitted) < 150:
                    submitted.append(submit(c, pipeline))
            except BaseException as exc:
                failures.append(exc)

        sender = threading.Thread(target=load)
        sender.start()
        brackets = []
        try:
            while sender.is_alive():
                before = queued_in_db()
                seen = sample(scrape(fleet.maintenance_metrics), depth[0], **depth[1])
                brackets.append((before, seen, queued_in_db()))
        finally:
            stop.set()
            sender.join()
    assert not failures, failures
    assert len(brackets) >= 3, brackets
    assert all(lo <= seen <= hi for lo, seen, hi in brackets), brackets
    final = scrape(fleet.maintenance_metrics)
    assert sample(final, *depth[:1], **depth[1]) == queued_in_db() == len(submitted) == 150
    oldest = fleet.sql("SELECT min(created_at) FROM jobs WHERE pipeline = :p "
                       "AND status = 'queued'", p=pipeline)[0]
    age = sample(final, "omnijobs_queue_oldest_age_seconds", pipeline=pipeline,
                 lane="interactive")
    assert 0 < age <= (datetime.now(UTC) - oldest).total_seconds()
    assert sample(final, "omnijobs_queue_depth", pipeline=pipeline, lane="bulk") == 0
    assert sample(final, "omnijobs_jobs_running", pipeline=pipeline) == 0
    assert sample(final, "omnijobs_workers", pipeline=pipeline) == 0
    assert sample(final, "omnijobs_queue_signals_ok") == 1
    with fleet.client(key) as c:  # leave nothing queued for the tests after
        for job_id in submitted:
            assert c.post(f"/v1/jobs/{job_id}/cancel").status_code == 200


def test_running_jobs_and_workers_match_the_database(fleet: FleetStack):
    worker = fleet.start_worker("gauge-worker", "test-sleep")
    registry = WorkerRepository(make_sessionmaker(make_engine(fleet.db_url)))
    try:
        with fleet.client(fleet.new_key("running")) as c:
            job_id = submit(c, "test-sleep", "8")
            wait_until(lambda: c.get(f"/v1/jobs/{job_id}").json()["status"] == "running", 30,
                       "the job to run")
            page = scrape(fleet.maintenance_metrics)
            running = fleet.sql("SELECT count(*) FROM jobs WHERE pipeline = 'test-sleep' "
                                "AND status = 'running'")[0]
            assert sample(page, "omnijobs_jobs_running", pipeline="test-sleep") == running == 1
            assert sample(page, "omnijobs_workers", pipeline="test-sleep") == \
                registry.serving(["test-sleep"])["test-sleep"] == 1
            c.post(f"/v1/jobs/{job_id}/cancel")
    finally:
        worker.stop()
    resp = httpx.get(fleet.maintenance_metrics, timeout=10)
    assert "omnijobs_webhook_deliveries_total" in resp.text  # its own metrics beside them
