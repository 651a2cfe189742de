"""What every family of job transitions shares: the row -> record mapping, the list's
filters and cursor, and the sessions a repository holds.

The jobs repository is split by transition family (``job_claims``, ``job_ends``,
``job_sweeps``); ``jobs.JobRepository`` puts them back together.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import literal, select, tuple_, update
from sqlalchemy.orm import Session, joinedload, sessionmaker

from core.errors import InvalidRequest
from core.jobs import JobKind, JobStatus

from ..models import Job, Output, UTCDateTime
from ..records import MAIN, JobFilter, JobObjects, JobRecord, OutputRecord
from . import usage as metering
from .quotas import Quotas


def utcnow() -> datetime:
    return datetime.now(UTC)



def output_record(o: Output) -> OutputRecord:
    return OutputRecord(
        index=o.index, key=o.key, content_type=o.content_type, bytes=o.bytes,
        sha256=o.sha256, duration_s=o.duration_s, sample_rate=o.sample_rate,
        channels=o.channels, width=o.width, height=o.height, fps=o.fps, frames=o.frames,
        variant=o.variant)



def job_record(j: Job, outputs: tuple[OutputRecord, ...] | None = None) -> JobRecord:
    """``outputs``: given when the caller knows them (a claimed job has none), so the
    relationship is not loaded for nothing. A video's previews are rows of their own."""
    rows = outputs if outputs is not None else tuple(output_record(o) for o in j.outputs)
    return JobRecord(
        id=j.id, tenant_id=j.tenant_id, kind=JobKind(j.kind), model=j.model,
        pipeline=j.pipeline, status=JobStatus(j.status), progress=j.progress,
        request=dict(j.request), metadata=j.metadata_, attempts=j.attempts,
        max_attempts=j.max_attempts, error_code=j.error_code, error_message=j.error_message,
        created_at=j.created_at, updated_at=j.updated_at, started_at=j.started_at,
        completed_at=j.completed_at, lease_expires_at=j.lease_expires_at,
        idempotency_key=j.idempotency_key, dispatch_token=j.dispatch_token,
        expires_at=j.expires_at, outputs_deleted_at=j.outputs_deleted_at,
        start_by=j.start_by, max_run_s=j.max_run_s, batch_id=j.batch_id, ready_at=j.ready_at,
        usage=metering.record(getattr(j, "usage", None)),  # a claimed row has none
        outputs=tuple(sorted((o for o in rows if o.variant == MAIN), key=lambda o: o.index)),
        previews=tuple(o for o in rows if o.variant != MAIN),
    )



def page_after(s: Session, tenant_id: str | None, after: str, order: str):
    """The rows past the cursor. An unknown (or deleted) cursor is an error, never a
    restart at page one: a client paging through would loop."""
    q = select(Job.created_at, Job.id).where(Job.id == after)
    cursor = s.execute(q if tenant_id is None else q.where(Job.tenant_id == tenant_id)).first()
    if cursor is None:
        raise InvalidRequest("'after' is not a job of this list (unknown or deleted)",
                             param="after", code="invalid_cursor")
    # A row-value comparison (PostgreSQL; SQLite since 3.15): a range of the
    # (tenant_id, created_at, id) index, where page k starts at once. Spelled as
    # ``a < c OR (a = c AND b < i)`` it is a filter, and page k reads the k-1 before it.
    key, at = tuple_(Job.created_at, Job.id), tuple_(
        literal(cursor[0], UTCDateTime()), literal(cursor[1], Job.id.type))
    return key < at if order == "desc" else key > at



def filtered(q, f: JobFilter):
    """The list's ``WHERE``: one place, whoever lists (the API's routes, the console)."""
    if f.tenant_id is not None:
        q = q.where(Job.tenant_id == f.tenant_id)
    for value, column in ((f.status, Job.status), (f.kind, Job.kind), (f.model, Job.model),
                          (f.batch_id, Job.batch_id)):
        if value is not None:
            q = q.where(column == str(value))
    if f.created_after is not None:
        q = q.where(Job.created_at >= f.created_after)
    if f.created_before is not None:
        q = q.where(Job.created_at < f.created_before)
    return q



def owned_keys(j: Job) -> JobObjects:
    status = JobStatus(j.status)
    if status is JobStatus.RUNNING:  # the current attempt writes; earlier ones are over
        return JobObjects(None, j.attempts)
    if status is JobStatus.QUEUED:  # the next claim is attempt + 1
        return JobObjects(None, j.attempts + 1)
    if status is JobStatus.COMPLETED and j.outputs_deleted_at is None:
        return JobObjects(frozenset(o.key for o in j.outputs))
    return JobObjects(frozenset())


class JobStore:
    """The sessions every transition family uses, and the reads they share."""

    def __init__(self, sessions: sessionmaker[Session], quotas: Quotas | None = None) -> None:
        self._sessions = sessions
        self._engine = sessions.kw["bind"]
        self._dialect = self._engine.dialect.name  # PostgreSQL: the one-statement paths
        # Reads that are one statement run on their own: no BEGIN before and no ROLLBACK
        # after (two round trips of three), for the reads every watcher makes.
        self._reads = sessionmaker(self._engine.execution_options(isolation_level="AUTOCOMMIT"),
                                   expire_on_commit=False)
        self._quotas = quotas  # admission for submits (the API's); None: no limits

    def get(self, job_id: str, tenant_id: str | None = None) -> JobRecord | None:
        q = select(Job).where(Job.id == job_id)
        return self._one(q if tenant_id is None else q.where(Job.tenant_id == tenant_id))

    def _one(self, q) -> JobRecord | None:
        """One job with its outputs and usage record, in one statement (joined, not the
        relationships' own ``selectin`` reads)."""
        with self._reads() as s:
            j = s.execute(q.options(joinedload(Job.outputs), joinedload(Job.usage))
                          ).unique().scalar_one_or_none()
            return job_record(j) if j else None

    def _running(self, job_id: str, attempt: int):
        return update(Job).where(Job.id == job_id, Job.status == JobStatus.RUNNING.value,
                                 Job.attempts == attempt)
