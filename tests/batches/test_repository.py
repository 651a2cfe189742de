"""Batch rows on both backends: bulk expansion (all of it or none), live counts, the lease
that lets exactly one process work on a batch, cancel and expiry as single transactions,
and the terminal transition with its files and its webhook event."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select, text, update

from core.batches import BULK_LANE, BatchStatus
from core.errors import BatchQuotaExceeded
from core.jobs import JobKind, JobStatus
from storage.db import make_engine, make_sessionmaker
from storage.models import Batch, Job, OutboxMessage
from storage.records import BatchLine, LineRejected, NewFile, NewJob
from storage.repositories import (
    BatchRepository,
    FileRepository,
    JobRepository,
    KeyRepository,
    OutboxRepository,
    WebhookRepository,
)

LEASE_S = 60.0


class Repos:
    def __init__(self, url: str) -> None:
        self.sessions = make_sessionmaker(make_engine(url))
        self.batches = BatchRepository(self.sessions)
        self.files = FileRepository(self.sessions)
        self.jobs = JobRepository(self.sessions)
        self.outbox = OutboxRepository(self.sessions)
        self.hooks = WebhookRepository(self.sessions)
        self.tenant, _ = KeyRepository(self.sessions).create_key("t-" + uuid.uuid4().hex)

    def batch(self, max_active: int = 10):
        return self.batches.create(self.tenant, endpoint="/v1/audio/speech",
                                   input_file_id="file-x", completion_window="24h",
                                   metadata={"k": "v"}, max_active=max_active)

    def line(self, index: int, refused: bool = False) -> BatchLine:
        if refused:
            return BatchLine(index, f"c{index}", rejected=LineRejected(400, {"error": {}}))
        return BatchLine(index, f"c{index}", job=NewJob(
            tenant_id=self.tenant, kind=JobKind.SPEECH, model="tts-1", pipeline="piper-joe",
            queue="pipeline.piper-joe", request={"input": f"line {index}"}, metadata=None,
            max_attempts=3))

    def expanded(self, n: int, refused: tuple[int, ...] = ()):
        batch = self.batch()
        token = self.batches.take(batch.id, BatchStatus.VALIDATING, LEASE_S)
        queued = self.batches.expand(batch.id, token, (self.line(i, i in refused)
                                                       for i in range(n)))
        return batch, queued

    def count(self, model, *where) -> int:
        with self.sessions() as s:
            return s.scalar(select(func.count()).select_from(model).where(*where))


@pytest.fixture
def repos(db_url) -> Repos:
    return Repos(db_url)


def test_expansion_inserts_every_job_message_and_refusal_at_once(repos):
    batch, queued = repos.expanded(12_345, refused=(3, 12_000))
    assert len(queued) == 12_343
    got = repos.batches.get(batch.id)
    assert got.status is BatchStatus.IN_PROGRESS and got.in_progress_at is not None
    assert (got.counts.total, got.counts.completed, got.counts.failed) == (12_345, 0, 2)
    assert repos.count(Job, Job.batch_id == batch.id, Job.status == "queued") == 12_343
    ours = {job_id for job_id, _, _ in queued}
    assert not [m for m in repos.outbox.due(grace_s=0, limit=100_000) if m.job_id in ours]
    with repos.sessions.begin() as s:  # past the backstop, the relay may send them
        s.execute(update(OutboxMessage).where(OutboxMessage.job_id.in_(ours)).values(
            available_at=datetime.now(UTC)))
    messages = [m for m in repos.outbox.due(grace_s=0, limit=100_000) if m.job_id in ours]
    assert len(messages) == 12_343
    assert {m.payload["lane"] for m in messages} == {BULK_LANE}
    tokens = {job_id: token for job_id, _, token in queued}
    assert all(m.payload["token"] == tokens[m.job_id] for m in messages)
    job = repos.jobs.get(queued[0][0], repos.tenant)
    assert job.dispatch_token == tokens[job.id]
    assert repos.jobs.claim(job.id, "w", 60, token="stale") is None  # tokens are real
    assert job.request == {"input": "line 0"} and job.status is JobStatus.QUEUED
    assert [r.line for r in repos.batches.rejections(batch.id)] == [3, 12_000]
    lines = [(i, c) for i, c, _ in repos.batches.results(batch.id, page=1000)]
    assert lines == [(i, f"c{i}") for i in range(12_345) if i not in (3, 12_000)]
    repos.batches.mark_published(batch.id)
    assert not [m for m in repos.outbox.due(grace_s=0, limit=100_000) if m.job_id in ours]


def test_a_failing_line_source_leaves_nothing_behind(repos):
    batch = repos.batch()
    token = repos.batches.take(batch.id, BatchStatus.VALIDATING, LEASE_S)

    def lines():
        for i in range(7000):  # past one chunk: some rows were already sent
            yield repos.line(i)
        raise RuntimeError("line 7001 is unusable")

    messages = repos.count(OutboxMessage)
    with pytest.raises(RuntimeError):
        repos.batches.expand(batch.id, token, lines())
    assert repos.count(Job, Job.batch_id == batch.id) == 0
    assert repos.count(OutboxMessage) == messages
    assert repos.batches.get(batch.id).status is BatchStatus.VALIDATING
    assert repos.batches.fail(batch.id, token, [{"code": "x", "line": 7001, "message": "m"}])
    failed = repos.batches.get(batch.id)
    assert failed.status is BatchStatus.FAILED and failed.errors[0]["line"] == 7001


def test_one_process_at_a_time_works_on_a_batch(repos):
    batch = repos.batch()
    token = repos.batches.take(batch.id, BatchStatus.VALIDATING, LEASE_S)
    assert token and repos.batches.take(batch.id, BatchStatus.VALIDATING, LEASE_S) is None
    assert repos.batches.expand(batch.id, "not-ours", iter([])) is None
    assert not repos.batches.fail(batch.id, "not-ours", [])
    with repos.sessions.begin() as s:  # the holder died: its lease runs out
        s.execute(update(Batch).where(Batch.id == batch.id).values(
            lease_expires_at=datetime.now(UTC) - timedelta(seconds=1)))
    assert (batch.id, BatchStatus.VALIDATING) in repos.batches.due()
    late = repos.batches.take(batch.id, BatchStatus.VALIDATING, LEASE_S)
    assert late and late != token
    assert repos.batches.expand(batch.id, token, iter([])) is None  # the old holder lost it


def test_the_bulk_quota_counts_unfinished_batches_only(repos):
    first = repos.batch(max_active=2)
    repos.batch(max_active=2)
    with pytest.raises(BatchQuotaExceeded):
        repos.batch(max_active=2)
    assert repos.batches.cancel(first.id, repos.tenant).status is BatchStatus.CANCELLING
    token = repos.batches.take(first.id, BatchStatus.CANCELLING, LEASE_S)
    assert repos.batches.finish(first.id, token, None, None).status is BatchStatus.CANCELLED
    repos.batch(max_active=2)  # a finished batch no longer counts


def test_cancel_cancels_queued_and_running_jobs_in_one_step(repos):
    batch, queued = repos.expanded(5)
    done = repos.jobs.claim(queued[0][0], "w", 60)
    assert repos.jobs.complete(done.id, done.attempts, [], 3600)
    running = repos.jobs.claim(queued[1][0], "w", 60)
    assert repos.batches.cancel(batch.id, repos.tenant).status is BatchStatus.CANCELLING
    assert repos.jobs.get(running.id).status is JobStatus.CANCELLED
    assert not repos.jobs.heartbeat(running.id, running.attempts, 60)  # the worker stops
    assert (batch.id, BatchStatus.CANCELLING) in repos.batches.due()
    token = repos.batches.take(batch.id, BatchStatus.CANCELLING, LEASE_S)
    ended = repos.batches.finish(batch.id, token, None, None)
    assert ended.status is BatchStatus.CANCELLED and ended.cancelled_at is not None
    assert (ended.counts.total, ended.counts.completed, ended.counts.failed) == (5, 1, 4)
    assert repos.batches.cancel(batch.id, repos.tenant).status is BatchStatus.CANCELLED


def test_completion_and_expiry_end_the_batch_with_files_and_an_event(repos):
    endpoint, _ = repos.hooks.create_endpoint(repos.tenant, name="b", url="https://a.example",
                                              event_types=["batch.completed", "batch.expired",
                                                           "speech.completed"])
    batch, queued = repos.expanded(2)
    assert repos.batches.begin_finalize(batch.id, LEASE_S) is None  # jobs still queued
    for job_id, _, _ in queued:
        claimed = repos.jobs.claim(job_id, "w", 60)
        repos.jobs.complete(job_id, claimed.attempts, [], 3600)
    assert (batch.id, BatchStatus.IN_PROGRESS) in repos.batches.due()
    token = repos.batches.begin_finalize(batch.id, LEASE_S)
    assert repos.batches.get(batch.id).status is BatchStatus.FINALIZING
    out = NewFile(tenant_id=repos.tenant, purpose="batch_output", filename="o.jsonl",
                  bytes=10, key="k", id="file-" + uuid.uuid4().hex)
    ended = repos.batches.finish(batch.id, token, out, None)
    assert ended.status is BatchStatus.COMPLETED and ended.output_file_id == out.id
    assert ended.error_file_id is None and repos.files.get(out.id, repos.tenant).bytes == 10
    assert repos.batches.finish(batch.id, token, out, None) is None  # once only
    log = repos.hooks.deliveries_for_job(repos.tenant, batch.id)
    assert [d.event_type for d in log] == ["batch.completed"]
    assert log[0].endpoint_id == endpoint.id
    assert all(repos.hooks.deliveries_for_job(repos.tenant, j) == [] for j, _, _ in queued)
    alone = repos.jobs.create(repos.line(0).job)[0]  # a job of no batch still reports
    repos.jobs.complete(alone.id, repos.jobs.claim(alone.id, "w", 60).attempts, [], 3600)
    assert [d.event_type for d in repos.hooks.deliveries_for_job(repos.tenant, alone.id)] == [
        "speech.completed"]

    late, queued = repos.expanded(3)
    claimed = repos.jobs.claim(queued[0][0], "w", 60)
    repos.jobs.complete(claimed.id, claimed.attempts, [], 3600)
    repos.jobs.claim(queued[1][0], "w", 60)
    with repos.sessions.begin() as s:
        s.execute(update(Batch).where(Batch.id == late.id).values(
            expires_at=datetime.now(UTC) - timedelta(seconds=1)))
    token = repos.batches.begin_finalize(late.id, LEASE_S)
    assert token and repos.count(Job, Job.batch_id == late.id, Job.status == "expired") == 2
    ended = repos.batches.finish(late.id, token, None, None)
    assert ended.status is BatchStatus.EXPIRED and ended.expired_at is not None
    assert (ended.counts.completed, ended.counts.failed) == (1, 2)
    assert [d.event_type for d in repos.hooks.deliveries_for_job(repos.tenant, late.id)] == [
        "batch.expired"]


def test_a_re_sent_render_message_keeps_the_bulk_lane(repos):
    _, queued = repos.expanded(1)
    claimed = repos.jobs.claim(queued[0][0], "w", 60)
    msg = repos.jobs.requeue(claimed.id, claimed.attempts, queue="pipeline.piper-joe",
                             delay_s=0, code="pipeline_error", message="retry")
    assert msg.payload["lane"] == BULK_LANE
    interactive, msg = repos.jobs.create(NewJob(
        tenant_id=repos.tenant, kind=JobKind.SPEECH, model="tts-1", pipeline="piper-joe",
        queue="pipeline.piper-joe", request={"input": "now"}, metadata=None, max_attempts=3))
    assert "lane" not in msg.payload


def test_files_list_and_delete(repos):
    made = [repos.files.create(NewFile(tenant_id=repos.tenant, purpose="batch",
                                       filename=f"{i}.jsonl", bytes=i, key=f"k{i}"))
            for i in range(3)]
    page, more = repos.files.list(repos.tenant, limit=2, order="asc")
    assert [f.id for f in page] == [f.id for f in made[:2]] and more
    page, more = repos.files.list(repos.tenant, after=page[-1].id, limit=2, order="asc")
    assert [f.id for f in page] == [made[2].id] and not more
    assert repos.files.delete(made[0].id, "someone-else") is None
    assert repos.files.delete(made[0].id, repos.tenant).key == "k0"
    assert repos.files.get(made[0].id) is None


def test_cancel_while_validating_creates_nothing(repos):
    batch = repos.batch()
    token = repos.batches.take(batch.id, BatchStatus.VALIDATING, LEASE_S)
    assert repos.batches.cancel(batch.id, repos.tenant).status is BatchStatus.CANCELLING
    assert repos.batches.expand(batch.id, token, (repos.line(i) for i in range(3))) is None
    assert repos.count(Job, Job.batch_id == batch.id) == 0
    ended = repos.batches.finish(batch.id, repos.batches.take(
        batch.id, BatchStatus.CANCELLING, LEASE_S), None, None)
    assert ended.status is BatchStatus.CANCELLED and ended.counts.total == 0


def test_batch_jobs_never_count_against_the_interactive_quotas(repos):
    from core.errors import TooManyRequests
    from storage.repositories.quotas import INTERACTIVE, Quota, Quotas

    repos.expanded(5)  # five queued batch jobs of this tenant, on piper-joe
    interactive = JobRepository(repos.sessions, Quotas({INTERACTIVE: Quota(2, 10_000)}))
    for _ in range(2):
        interactive.create(repos.line(0).job)
    with pytest.raises(TooManyRequests):
        interactive.create(repos.line(0).job)


def test_a_cancel_caught_in_a_deadlock_runs_again(pg_url):
    """A worker's claim locks two jobs of the lane in an order no cancel can share; when
    PostgreSQL breaks such a cycle by aborting the cancel, the cancel runs again instead
    of answering 503. Which side of a real cycle the database aborts depends on whose
    deadlock timer fires first, so the test does not race for it: a trigger on the
    batch's jobs raises the very error (SQLSTATE 40P01) once, from inside the cancel's
    transaction, after the batch row was already moved."""
    repos = Repos(pg_url)
    batch, _ = repos.expanded(3)
    name = f"once_{uuid.uuid4().hex[:12]}"
    engine = make_engine(pg_url)
    try:
        with engine.begin() as c:
            c.execute(text(f"CREATE SEQUENCE {name}"))
            c.execute(text(
                f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                f"IF nextval('{name}') = 1 THEN RAISE EXCEPTION 'deadlock detected' "
                f"USING ERRCODE = 'deadlock_detected'; END IF; RETURN NEW; END $$"))
            c.execute(text(
                f"CREATE TRIGGER {name} BEFORE UPDATE ON jobs FOR EACH ROW "
                f"WHEN (OLD.batch_id = '{batch.id}') EXECUTE FUNCTION {name}()"))
        result = repos.batches.cancel(batch.id, repos.tenant)
        with engine.connect() as c:
            raised = c.execute(text(f"SELECT last_value FROM {name}")).scalar_one()
    finally:
        with engine.begin() as c:
            c.execute(text(f"DROP TRIGGER IF EXISTS {name} ON jobs"))
            c.execute(text(f"DROP FUNCTION IF EXISTS {name}()"))
            c.execute(text(f"DROP SEQUENCE IF EXISTS {name}"))
        engine.dispose()
    assert raised > 1, "the first try was not aborted: the test proves nothing"
    assert result.status is BatchStatus.CANCELLING
    assert repos.count(Job, Job.batch_id == batch.id,
                       Job.status == JobStatus.CANCELLED.value) == 3


@pytest.mark.parametrize("end", ["cancel", "expire"])
def test_a_batchs_ended_jobs_that_ran_are_on_the_usage_record(repos, end):
    """Usage counts every job that ran, however it ended: the batch's cancel or expiry
    ends its running jobs in one statement, and settles their usage in the same
    transaction; the queued ones never ran and have none (as a job cancelled alone)."""
    batch, queued = repos.expanded(4)
    done = repos.jobs.claim(queued[0][0], "w", 60)
    assert repos.jobs.complete(done.id, done.attempts, [], 3600, render=(0.5, "cpu"))
    running = repos.jobs.claim(queued[1][0], "w", 60)
    if end == "cancel":
        repos.batches.cancel(batch.id, repos.tenant)
    else:
        ended_batch_by_expiry(repos, batch.id)
    assert repos.jobs.get(running.id).status in (JobStatus.CANCELLED, JobStatus.EXPIRED)
    assert repos.jobs.get(running.id).usage is not None  # it ran: it counts
    assert repos.jobs.record_render(running.id, running.attempts, 0.75, "cpu")  # reported late
    assert repos.jobs.get(running.id).usage.render_s == 0.75
    assert [repos.jobs.get(q[0]).usage for q in queued[2:]] == [None, None]  # never ran


def ended_batch_by_expiry(repos, batch_id: str) -> None:
    """The batch's window passed: the finalize step expires its unfinished jobs."""
    with repos.sessions.begin() as s:
        s.execute(update(Batch).where(Batch.id == batch_id).values(
            expires_at=datetime.now(UTC) - timedelta(seconds=1)))
    assert repos.batches.begin_finalize(batch_id, LEASE_S) is not None
