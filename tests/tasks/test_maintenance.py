"""The recovery steps of the maintenance process against a real broker (Redis): what
reached the broker is read back from Redis itself, not from the step's return value."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator

import pytest
import redis

from core.batches import BULK_LANE
from core.settings import Settings
from tasks.app import make_celery
from tasks.broker import waiting_dispatches
from tasks.dispatch import BULK_PRIORITY
from tasks.recovery import prune_outbox, relay_outbox, sweep_stale_queued
from tasks.render import run_job
from tasks.runtime import WorkerRuntime

from ..services import redis_db
from .test_render import PIPELINES, outcome, submit, tenant  # noqa: F401  (fixtures)

# A pipeline no worker of the session's shared stack serves, so none of them can take
# these messages even if its Redis database is the one these tests got.
PIPELINE = "test-snapshots"
QUEUE = f"pipeline.{PIPELINE}"
STALE_S = 0.3


@pytest.fixture
def broker() -> Iterator[str]:
    with redis_db() as url:
        yield url


@pytest.fixture
def rt(tmp_path, sqlite_url, broker):
    settings = Settings(home=tmp_path, database_url=sqlite_url, broker_url=broker,
                        pipelines=PIPELINES, pipeline_modules=["tests.fake_pipelines"],
                        max_attempts=2, retry_backoff_s=0, lease_s=5, outbox_grace_s=0,
                        stale_queued_s=STALE_S)
    return WorkerRuntime(settings)


@pytest.fixture
def app(rt):
    return make_celery(rt.settings)


def waiting(broker: str, queue: str = QUEUE) -> list[tuple[str, list]]:
    """(task, args) of each message waiting in a Redis queue, decoded from the raw list."""
    found = []
    for raw in redis.Redis.from_url(broker).lrange(queue, 0, -1):
        payload = json.loads(raw)
        args = json.loads(base64.b64decode(payload["body"]))[0]
        found.append((payload["headers"]["task"], args))
    return found


def test_relay_puts_the_render_message_in_the_broker(rt, app, tenant, broker):  # noqa: F811
    job = submit(rt, tenant, PIPELINE)
    assert waiting(broker) == []
    assert relay_outbox(rt, app) == 1
    assert waiting(broker) == [("omnijobs.render", [job.id, job.dispatch_token])]
    assert relay_outbox(rt, app) == 0  # published once: marked in the outbox
    assert len(waiting(broker)) == 1


def _stage(rt, owner: str, count: int, lane: str | None) -> None:
    """A job and ``count`` more due render messages of it in the outbox, as a broker
    outage leaves them (a batch's, when ``lane`` is the bulk lane), in one transaction."""
    from storage.db import make_engine, make_sessionmaker
    from storage.repositories.outbox import add_message

    job = submit(rt, owner, PIPELINE)  # its own message is an interactive one
    with make_sessionmaker(make_engine(rt.settings.db_url)).begin() as s:
        for i in range(count):
            add_message(s, topic="render", job_id=job.id, queue=QUEUE,
                        payload={"job_id": job.id, "token": f"t{i}",
                                 **({"lane": lane} if lane else {})})


def test_the_relay_drains_a_backlog_in_one_run_not_a_page_per_period(rt, app, broker,
                                                                      tenant):  # noqa: F811
    """A broker outage left 5,000 messages behind: one run publishes them all (it used to
    publish 100 per run, one run every 5 s)."""
    _stage(rt, tenant, 5000, BULK_LANE)
    # A budget no loaded machine runs out of: what counts is that one run loops.
    assert relay_outbox(rt, app, budget_s=120) == 5001  # the job's own message, the backlog
    assert redis.Redis.from_url(broker).llen(f"{QUEUE}\x06\x16{BULK_PRIORITY}") == 5000
    assert rt.outbox.due(grace_s=0, limit=10) == []


def test_the_relay_sends_interactive_messages_before_a_batch_backlog(rt, app, broker,
                                                                      tenant):  # noqa: F811
    """Bulk messages older than the interactive ones: with room for one page only, the
    interactive ones are among it."""
    _stage(rt, tenant, 300, BULK_LANE)
    _stage(rt, tenant, 5, None)  # newer, interactive
    assert relay_outbox(rt, app, budget_s=0, page=100) == 7  # both jobs' own, 5 staged
    assert [task for task, _ in waiting(broker)] == ["omnijobs.render"] * 7
    assert len(rt.outbox.due(grace_s=0, limit=1000)) == 300  # the backlog, next run


def test_sweep_leaves_a_job_in_a_long_queue_alone(rt, app, tenant, broker):  # noqa: F811
    job = submit(rt, tenant, PIPELINE)
    relay_outbox(rt, app)
    time.sleep(STALE_S + 0.1)
    assert [j.id for j in rt.jobs.stale_queued(STALE_S)] == [job.id]  # old enough...
    assert sweep_stale_queued(rt, app) == 0  # ...but its message is still in the queue
    assert len(rt.outbox.for_job(job.id)) == 1
    assert len(waiting(broker)) == 1


def test_sweep_resends_a_lost_message_and_voids_it(rt, app, tenant, broker):  # noqa: F811
    job = submit(rt, tenant, PIPELINE)
    relay_outbox(rt, app)
    redis.Redis.from_url(broker).delete(QUEUE)  # a broker restarted without its data
    time.sleep(STALE_S + 0.1)
    assert sweep_stale_queued(rt, app) == 1
    assert sweep_stale_queued(rt, app) == 0  # re-sent once, not every round
    [(task, [job_id, token])] = waiting(broker)
    assert (task, job_id) == ("omnijobs.render", job.id) and token != job.dispatch_token
    assert len(rt.outbox.for_job(job.id)) == 2
    # The lost message turning up after all can no longer claim the job; the new one can.
    assert outcome(run_job(rt, app, job.id, job.dispatch_token)) == "skipped"
    assert outcome(run_job(rt, app, job.id, token)) == "completed"


def test_sweep_counts_a_taken_unclaimed_message_lost(rt, app, tenant, broker):  # noqa: F811
    """Taken by a worker that then died: no longer waiting in the queue."""
    job = submit(rt, tenant, PIPELINE)
    relay_outbox(rt, app)
    assert redis.Redis.from_url(broker).rpop(QUEUE)  # taken by a worker that then died
    time.sleep(STALE_S + 0.1)
    assert sweep_stale_queued(rt, app) == 1
    assert waiting(broker)[0][1][0] == job.id


def test_sweep_leaves_unpublished_messages_to_the_relay(rt, app, tenant):  # noqa: F811
    job = submit(rt, tenant, PIPELINE)  # the broker was down: still in the outbox
    time.sleep(STALE_S + 0.1)
    assert rt.jobs.stale_queued(STALE_S) == []
    assert sweep_stale_queued(rt, app) == 0
    assert len(rt.outbox.for_job(job.id)) == 1


def test_published_outbox_rows_are_pruned_after_retention(rt, app, tenant):  # noqa: F811
    sent = submit(rt, tenant, PIPELINE)
    relay_outbox(rt, app)
    unsent = submit(rt, tenant, PIPELINE)
    rt.settings.outbox_retention_s = 0.2
    time.sleep(0.3)
    assert prune_outbox(rt, app) == 1
    assert rt.outbox.for_job(sent.id) == []
    assert len(rt.outbox.for_job(unsent.id)) == 1  # never published: kept for the relay


def test_filesystem_broker_is_inspected_too(tmp_path, sqlite_url, tenant):  # noqa: F811
    settings = Settings(home=tmp_path, database_url=sqlite_url, pipelines=PIPELINES,
                        pipeline_modules=["tests.fake_pipelines"], outbox_grace_s=0)
    rt, app = WorkerRuntime(settings), make_celery(settings)
    job = submit(rt, tenant, PIPELINE)
    relay_outbox(rt, app)
    assert waiting_dispatches(app, [QUEUE]) == {(job.id, job.dispatch_token)}
    for path in settings.broker_folder.glob(f"*.{QUEUE}.msg"):
        path.unlink()
    assert waiting_dispatches(app, [QUEUE]) == set()


def test_maintenance_and_retention_settings(monkeypatch):
    from tasks.maintenance import PERIODS, periods

    monkeypatch.setenv("OMNIJOBS_MAINTENANCE_PERIODS", '{"relay": 1.5}')
    monkeypatch.setenv("OMNIJOBS_OUTPUT_TTL_S", "60")
    monkeypatch.setenv("OMNIJOBS_JOB_TTL_S", "120")
    monkeypatch.setenv("OMNIJOBS_OUTBOX_RETENTION_S", "30")
    monkeypatch.setenv("OMNIJOBS_STORAGE_RETRY_S", "9")
    s = Settings()
    assert periods(s.maintenance_periods) == {**PERIODS, "relay": 1.5}
    assert (s.output_ttl_s, s.job_ttl_s, s.outbox_retention_s, s.storage_retry_s) == (
        60, 120, 30, 9)
    with pytest.raises(ValueError, match="unknown steps"):
        periods({"relays": 1})
    with pytest.raises(ValueError, match="positive"):
        periods({"relay": 0})


def test_max_runtime_comes_from_the_spec_or_the_pipeline_options(tmp_path, sqlite_url):
    rt = WorkerRuntime(Settings(home=tmp_path, database_url=sqlite_url, pipelines=PIPELINES,
                                pipeline_modules=["tests.fake_pipelines"],
                                pipeline_options={"test-flaky": {"max_runtime_s": 2}}))
    assert rt.max_runtime_s("test-flaky") == 2
    assert rt.max_runtime_s("piper-joe") == 900
    assert rt.max_runtime_s("test-video") == 3600
