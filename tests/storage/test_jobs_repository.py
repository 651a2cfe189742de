"""The job repository on both backends: every transition is a compare-and-set."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import event, func, select
from sqlalchemy.orm import Session, sessionmaker

from core.errors import MESSAGE_LIMIT
from core.jobs import JobKind, JobStatus
from storage.db import make_engine, make_sessionmaker
from storage.models import Job, OutboxMessage, Output
from storage.records import JobRecord, NewJob, OutputRecord
from storage.repositories import JobRepository, KeyRepository, OutboxRepository

QUEUE = "render-test"
TTL = 3600.0


@dataclass
class Repos:
    jobs: JobRepository
    outbox: OutboxRepository
    keys: KeyRepository
    sessions: sessionmaker[Session]
    tenant: str

    def new_tenant(self) -> str:
        tenant_id, _ = self.keys.create_key("tenant-" + uuid.uuid4().hex)
        return tenant_id

    def submit(self, tenant: str | None = None, *, kind: JobKind = JobKind.SPEECH,
               idempotency_key: str | None = None, max_attempts: int = 3) -> JobRecord:
        job, msg = self.jobs.create(self.new_job(tenant, kind=kind,
                                                 idempotency_key=idempotency_key,
                                                 max_attempts=max_attempts))
        assert msg is not None
        return job

    def new_job(self, tenant: str | None = None, *, kind: JobKind = JobKind.SPEECH,
                idempotency_key: str | None = None, max_attempts: int = 3) -> NewJob:
        return NewJob(tenant_id=tenant or self.tenant, kind=kind, model="piper-joe",
                      pipeline="piper-joe", queue=QUEUE, request={"input": "hello"},
                      metadata={"ref": "t"}, max_attempts=max_attempts,
                      idempotency_key=idempotency_key)

    def due_for(self, job_id: str) -> list:
        # The PostgreSQL database is shared by the session: look only at this job's rows.
        return [m for m in self.outbox.due(grace_s=0, limit=100_000) if m.job_id == job_id]

    def messages_for(self, job_id: str) -> int:
        with self.sessions() as s:
            return s.scalar(select(func.count()).select_from(OutboxMessage)
                            .where(OutboxMessage.job_id == job_id))

    def output_rows(self, job_id: str) -> int:
        with self.sessions() as s:
            return s.scalar(select(func.count()).select_from(Output)
                            .where(Output.job_id == job_id))


def repos_on(url: str) -> Iterator[Repos]:
    engine = make_engine(url)
    sessions = make_sessionmaker(engine)
    keys = KeyRepository(sessions)
    tenant, _ = keys.create_key("tenant-" + uuid.uuid4().hex)
    yield Repos(JobRepository(sessions), OutboxRepository(sessions), keys, sessions, tenant)
    engine.dispose()


@pytest.fixture
def repos(db_url: str) -> Iterator[Repos]:
    yield from repos_on(db_url)


def outputs(n: int = 2) -> list[OutputRecord]:
    return [OutputRecord(index=i, key=f"jobs/x/{i}.wav", content_type="audio/wav",
                         bytes=1000 + i, sha256=f"{i:064x}", duration_s=1.5, sample_rate=22050,
                         channels=1) for i in range(n)]


# ---- submit ---------------------------------------------------------------------------


def test_create_queues_job_with_one_outbox_message(repos: Repos) -> None:
    job, msg = repos.jobs.create(repos.new_job())
    assert job.status is JobStatus.QUEUED
    assert job.attempts == 0 and job.progress == 0
    assert job.id.startswith("job_")
    assert job.request == {"input": "hello"} and job.metadata == {"ref": "t"}
    assert msg is not None
    assert (msg.job_id, msg.topic, msg.queue) == (job.id, "render", QUEUE)
    assert msg.payload == {"job_id": job.id, "token": job.dispatch_token}
    assert job.dispatch_token and msg.token == job.dispatch_token

    stored = repos.jobs.get(job.id)
    assert stored is not None and stored.status is JobStatus.QUEUED
    assert repos.messages_for(job.id) == 1

    due = repos.due_for(job.id)
    assert [m.id for m in due] == [msg.id]
    repos.outbox.mark_published([msg.id])
    assert repos.due_for(job.id) == []


def test_video_jobs_get_their_own_prefix(repos: Repos) -> None:
    assert repos.submit(kind=JobKind.VIDEO).id.startswith("video_")


def test_outbox_grace_hides_fresh_messages(repos: Repos) -> None:
    job = repos.submit()
    fresh = [m for m in repos.outbox.due(grace_s=3600, limit=100_000) if m.job_id == job.id]
    assert fresh == []
    assert len(repos.due_for(job.id)) == 1


def test_idempotency_key_returns_same_job_and_no_message(repos: Repos) -> None:
    first, msg = repos.jobs.create(repos.new_job(idempotency_key="abc"))
    assert msg is not None
    again, msg2 = repos.jobs.create(repos.new_job(idempotency_key="abc"))
    assert again.id == first.id
    assert msg2 is None
    assert repos.messages_for(first.id) == 1
    assert repos.jobs.get_by_idempotency_key(repos.tenant, "abc").id == first.id
    page, _ = repos.jobs.list(repos.tenant, limit=100)
    assert [j.id for j in page] == [first.id]


def test_idempotency_key_is_per_tenant(repos: Repos) -> None:
    other = repos.new_tenant()
    mine, _ = repos.jobs.create(repos.new_job(idempotency_key="same"))
    theirs, msg = repos.jobs.create(repos.new_job(other, idempotency_key="same"))
    assert msg is not None
    assert theirs.id != mine.id
    assert theirs.tenant_id == other


# ---- claim and heartbeat ----------------------------------------------------------------


def test_claim_is_compare_and_set(repos: Repos) -> None:
    job = repos.submit()
    before = datetime.now(UTC)
    claimed = repos.jobs.claim(job.id, "worker-a", lease_s=60)
    assert claimed is not None
    assert claimed.status is JobStatus.RUNNING
    assert claimed.attempts == 1
    assert claimed.lease_expires_at is not None and claimed.lease_expires_at > before
    assert claimed.started_at is not None

    assert repos.jobs.claim(job.id, "worker-b", lease_s=60) is None
    stored = repos.jobs.get(job.id)
    assert stored.attempts == 1 and stored.status is JobStatus.RUNNING


def test_claim_is_one_statement_on_jobs_and_reads_no_outputs(repos: Repos) -> None:
    """The claimed record is built from the UPDATE's own RETURNING: no read of the
    outputs (a claimed job has none), whatever the ORM's relationship loading."""
    job = repos.submit()
    statements: list[str] = []

    def note(conn, cursor, statement, params, context, executemany) -> None:
        statements.append(statement)

    engine = repos.sessions.kw["bind"]
    event.listen(engine, "before_cursor_execute", note)
    try:
        claimed = repos.jobs.claim(job.id, "worker-a", lease_s=60)
    finally:
        event.remove(engine, "before_cursor_execute", note)
    assert claimed is not None and claimed.outputs == ()
    assert (claimed.request, claimed.metadata) == ({"input": "hello"}, {"ref": "t"})
    assert claimed.dispatch_token == job.dispatch_token
    assert [s for s in statements if "UPDATE jobs" in s] and not [
        s for s in statements if "FROM outputs" in s]


def test_claim_of_unknown_job_returns_none(repos: Repos) -> None:
    assert repos.jobs.claim("job_does_not_exist", "w", lease_s=60) is None


def test_heartbeat_true_while_running_false_after_cancel(repos: Repos) -> None:
    job = repos.submit()
    claimed = repos.jobs.claim(job.id, "w", lease_s=1)
    assert repos.jobs.heartbeat(job.id, claimed.attempts, lease_s=600, progress=42) is True
    beat = repos.jobs.get(job.id)
    assert beat.progress == 42
    assert beat.lease_expires_at > claimed.lease_expires_at

    cancelled = repos.jobs.cancel(job.id, repos.tenant)
    assert cancelled.status is JobStatus.CANCELLED
    assert repos.jobs.heartbeat(job.id, claimed.attempts, lease_s=600) is False


def test_heartbeat_with_stale_attempt_is_refused(repos: Repos) -> None:
    job = repos.submit()
    repos.jobs.claim(job.id, "w", lease_s=60)
    assert repos.jobs.heartbeat(job.id, 99, lease_s=60) is False


def test_heartbeat_progress_is_clamped_below_100(repos: Repos) -> None:
    job = repos.submit()
    claimed = repos.jobs.claim(job.id, "w", lease_s=60)
    assert repos.jobs.heartbeat(job.id, claimed.attempts, lease_s=60, progress=250)
    assert repos.jobs.get(job.id).progress == 99


# ---- complete and fail ------------------------------------------------------------------


def test_complete_writes_outputs_and_status_together(repos: Repos) -> None:
    job = repos.submit()
    claimed = repos.jobs.claim(job.id, "w", lease_s=60)
    assert repos.jobs.complete(job.id, claimed.attempts, outputs(2), TTL) is True
    done = repos.jobs.get(job.id)
    assert done.status is JobStatus.COMPLETED
    assert done.progress == 100
    assert done.completed_at is not None
    assert done.lease_expires_at is None
    assert done.outputs == tuple(outputs(2))


def test_complete_with_stale_attempt_writes_nothing(repos: Repos) -> None:
    job = repos.submit()
    first = repos.jobs.claim(job.id, "w1", lease_s=60)
    assert repos.jobs.requeue(job.id, first.attempts, queue=QUEUE, delay_s=0,
                              code="lease_expired", message="reclaimed") is not None
    second = repos.jobs.claim(job.id, "w2", lease_s=60)
    assert second.attempts == 2

    assert repos.jobs.complete(job.id, first.attempts, outputs(3), TTL) is False
    stored = repos.jobs.get(job.id)
    assert stored.status is JobStatus.RUNNING
    assert stored.outputs == ()
    assert repos.output_rows(job.id) == 0

    assert repos.jobs.complete(job.id, second.attempts, outputs(1), TTL) is True
    assert repos.output_rows(job.id) == 1


def test_fail_records_code_and_truncated_message(repos: Repos) -> None:
    job = repos.submit()
    claimed = repos.jobs.claim(job.id, "w", lease_s=60)
    long = "x" * (MESSAGE_LIMIT * 3)
    assert repos.jobs.fail(job.id, "pipeline_error", long, attempt=claimed.attempts) is True
    failed = repos.jobs.get(job.id)
    assert failed.status is JobStatus.FAILED
    assert failed.error_code == "pipeline_error"
    assert failed.error_message == "x" * MESSAGE_LIMIT
    assert failed.completed_at is not None
    assert failed.lease_expires_at is None


def test_fail_from_queued_needs_explicit_from_status(repos: Repos) -> None:
    job = repos.submit()
    assert repos.jobs.fail(job.id, "invalid", "nope") is False
    assert repos.jobs.get(job.id).status is JobStatus.QUEUED
    assert repos.jobs.fail(job.id, "invalid", "nope", from_status=JobStatus.QUEUED) is True
    assert repos.jobs.get(job.id).status is JobStatus.FAILED


def test_fail_with_stale_attempt_is_refused(repos: Repos) -> None:
    job = repos.submit()
    claimed = repos.jobs.claim(job.id, "w", lease_s=60)
    assert repos.jobs.fail(job.id, "x", "y", attempt=claimed.attempts + 1) is False
    assert repos.jobs.get(job.id).status is JobStatus.RUNNING


def _terminal(repos: Repos, status: JobStatus) -> JobRecord:
    job = repos.submit()
    claimed = repos.jobs.claim(job.id, "w", lease_s=60)
    if status is JobStatus.COMPLETED:
        assert repos.jobs.complete(job.id, claimed.attempts, outputs(1), TTL)
    elif status is JobStatus.FAILED:
        assert repos.jobs.fail(job.id, "pipeline_error", "boom", attempt=claimed.attempts)
    else:
        assert repos.jobs.cancel(job.id, repos.tenant).status is JobStatus.CANCELLED
    return repos.jobs.get(job.id)


@pytest.mark.parametrize("status", [JobStatus.COMPLETED, JobStatus.FAILED,
                                    JobStatus.CANCELLED])
def test_terminal_states_never_change(repos: Repos, status: JobStatus) -> None:
    before = _terminal(repos, status)
    assert before.status is status
    attempt = before.attempts

    assert repos.jobs.complete(before.id, attempt, outputs(4), TTL) is False
    assert repos.jobs.fail(before.id, "late", "late failure", attempt=attempt) is False
    assert repos.jobs.fail(before.id, "late", "late failure") is False
    assert repos.jobs.claim(before.id, "late-worker", lease_s=60) is None
    assert repos.jobs.heartbeat(before.id, attempt, lease_s=60, progress=5) is False
    assert repos.jobs.requeue(before.id, attempt, queue=QUEUE, delay_s=0, code="x",
                              message="y") is None
    after_cancel = repos.jobs.cancel(before.id, repos.tenant)
    assert after_cancel.status is status

    after = repos.jobs.get(before.id)
    assert after == before
    assert repos.messages_for(before.id) == 1


# ---- requeue and leases -----------------------------------------------------------------


def test_requeue_with_delay_hides_message_until_due(repos: Repos) -> None:
    job = repos.submit()
    first_msg = repos.due_for(job.id)
    repos.outbox.mark_published([m.id for m in first_msg])
    claimed = repos.jobs.claim(job.id, "w", lease_s=60)

    before = datetime.now(UTC)
    msg = repos.jobs.requeue(job.id, claimed.attempts, queue=QUEUE, delay_s=1.5,
                             code="pipeline_error", message="transient")
    assert msg is not None
    assert msg.job_id == job.id and msg.queue == QUEUE
    assert msg.available_at > before + timedelta(seconds=1)

    queued = repos.jobs.get(job.id)
    assert queued.status is JobStatus.QUEUED
    assert queued.lease_expires_at is None
    assert queued.error_code == "pipeline_error"
    assert queued.attempts == 1
    assert repos.due_for(job.id) == []

    time.sleep(2.0)
    assert [m.id for m in repos.due_for(job.id)] == [msg.id]

    again = repos.jobs.claim(job.id, "w2", lease_s=60)
    assert again.attempts == 2
    assert again.error_code is None and again.error_message is None


def test_requeue_without_delay_is_due_now(repos: Repos) -> None:
    job = repos.submit()
    claimed = repos.jobs.claim(job.id, "w", lease_s=60)
    msg = repos.jobs.requeue(job.id, claimed.attempts, queue=QUEUE, delay_s=0, code="c",
                             message="m")
    assert msg.id in [m.id for m in repos.due_for(job.id)]


def test_requeue_of_queued_job_does_nothing(repos: Repos) -> None:
    job = repos.submit()
    assert repos.jobs.requeue(job.id, 0, queue=QUEUE, delay_s=0, code="c", message="m") is None
    assert repos.messages_for(job.id) == 1


def test_expired_leases_returns_running_job_past_its_lease(repos: Repos) -> None:
    fresh = repos.submit()
    repos.jobs.claim(fresh.id, "w", lease_s=600)
    expiring = repos.submit()
    repos.jobs.claim(expiring.id, "w", lease_s=0.01)
    queued = repos.submit()

    time.sleep(0.3)
    ids = {j.id for j in repos.jobs.expired_leases(limit=100_000)}
    assert expiring.id in ids
    assert fresh.id not in ids
    assert queued.id not in ids


def test_cancel_of_other_tenants_job_changes_nothing(repos: Repos) -> None:
    job = repos.submit()
    other = repos.new_tenant()
    assert repos.jobs.cancel(job.id, other) is None
    assert repos.jobs.get(job.id).status is JobStatus.QUEUED


# ---- reads ------------------------------------------------------------------------------


def test_tenant_isolation(repos: Repos) -> None:
    mine = repos.submit()
    other = repos.new_tenant()
    theirs = repos.submit(other)

    assert repos.jobs.get(mine.id, repos.tenant).id == mine.id
    assert repos.jobs.get(mine.id, other) is None
    assert repos.jobs.get(theirs.id, repos.tenant) is None
    page, has_more = repos.jobs.list(repos.tenant, limit=100)
    assert [j.id for j in page] == [mine.id]
    assert has_more is False
    page, _ = repos.jobs.list(other, limit=100)
    assert [j.id for j in page] == [theirs.id]
    # Another tenant can neither delete nor cancel the job.
    assert repos.jobs.delete(theirs.id, repos.tenant) is False
    assert repos.jobs.cancel(theirs.id, repos.tenant) is None
    assert repos.jobs.get(theirs.id).status is JobStatus.QUEUED


def _walk(repos: Repos, order: str, limit: int) -> tuple[list[str], list[bool]]:
    ids: list[str] = []
    flags: list[bool] = []
    after = None
    for _ in range(20):
        page, has_more = repos.jobs.list(repos.tenant, after=after, limit=limit, order=order)
        ids += [j.id for j in page]
        flags.append(has_more)
        if not has_more:
            break
        after = page[-1].id
    return ids, flags


@pytest.mark.parametrize("order", ["asc", "desc"])
def test_list_pagination_returns_each_job_once_in_order(repos: Repos, order: str) -> None:
    created = [repos.submit().id for _ in range(5)]
    expected = created if order == "asc" else created[::-1]

    ids, flags = _walk(repos, order, limit=2)
    assert ids == expected
    assert flags == [True, True, False]

    page, has_more = repos.jobs.list(repos.tenant, limit=5, order=order)
    assert [j.id for j in page] == expected and has_more is False
    page, has_more = repos.jobs.list(repos.tenant, limit=4, order=order)
    assert [j.id for j in page] == expected[:4] and has_more is True
    page, has_more = repos.jobs.list(repos.tenant, after=expected[-1], order=order)
    assert page == [] and has_more is False


def test_list_pagination_with_identical_timestamps(repos: Repos) -> None:
    """Jobs created in the same instant are still ordered (by id) and never repeated."""
    ids = {repos.submit().id for _ in range(5)}
    same = datetime(2026, 1, 1, tzinfo=UTC)
    with repos.sessions.begin() as s:
        for job in s.scalars(select(Job).where(Job.id.in_(ids))):
            job.created_at = same
    for order in ("asc", "desc"):
        walked, _ = _walk(repos, order, limit=2)
        assert walked == sorted(ids, reverse=order == "desc")


def test_list_filters_by_status_and_kind(repos: Repos) -> None:
    speech_queued = repos.submit()
    speech_running = repos.submit()
    repos.jobs.claim(speech_running.id, "w", lease_s=60)
    video_queued = repos.submit(kind=JobKind.VIDEO)

    def ids(**kw) -> set[str]:
        page, _ = repos.jobs.list(repos.tenant, limit=100, **kw)
        return {j.id for j in page}

    assert ids(status=JobStatus.QUEUED) == {speech_queued.id, video_queued.id}
    assert ids(status=JobStatus.RUNNING) == {speech_running.id}
    assert ids(kind=JobKind.VIDEO) == {video_queued.id}
    assert ids(kind=JobKind.SPEECH) == {speech_queued.id, speech_running.id}
    assert ids(kind=JobKind.SPEECH, status=JobStatus.QUEUED) == {speech_queued.id}
    assert ids(status=JobStatus.COMPLETED) == set()


def test_delete_removes_job_and_its_rows(repos: Repos) -> None:
    job = repos.submit()
    claimed = repos.jobs.claim(job.id, "w", lease_s=60)
    repos.jobs.complete(job.id, claimed.attempts, outputs(2), TTL)
    assert repos.jobs.delete(job.id, repos.tenant) is True
    assert repos.jobs.get(job.id) is None
    assert repos.output_rows(job.id) == 0
    assert repos.messages_for(job.id) == 0


def _utc(value: datetime | None) -> None:
    assert value is not None
    assert value.tzinfo is not None
    assert value.utcoffset() == timedelta(0)


def test_timestamps_are_aware_utc(repos: Repos) -> None:
    start = datetime.now(UTC) - timedelta(seconds=5)
    job = repos.submit()
    claimed = repos.jobs.claim(job.id, "w", lease_s=60)
    repos.jobs.complete(job.id, claimed.attempts, outputs(1), TTL)
    done = repos.jobs.get(job.id)
    for value in (done.created_at, done.updated_at, done.started_at, done.completed_at):
        _utc(value)
        assert start <= value <= datetime.now(UTC) + timedelta(seconds=5)
    assert done.created_at <= done.started_at <= done.completed_at

    listed, _ = repos.jobs.list(repos.tenant)
    _utc(listed[0].created_at)
    _utc(claimed.lease_expires_at)
    msg = repos.jobs.create(repos.new_job())[1]
    _utc(msg.available_at)
    _utc(repos.due_for(msg.job_id)[0].available_at)
