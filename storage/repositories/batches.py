"""Batches: creation under the bulk quota, expansion into jobs (bulk inserts), cancel, the
lease of the one process that validates or finalizes a batch, and the terminal
transitions, each with its webhook event in the same transaction.

Every status change is a compare-and-set on the batch's status (and, for the work a
process does, its lease token): a second maintenance process, or one whose lease ran out
and was taken over, changes nothing.
"""

from __future__ import annotations

import re
import secrets
import uuid
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta

from sqlalchemy import and_, exists, func, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from core.batches import BULK_LANE, COMPLETION_WINDOWS, EVENTS, BatchStatus, ending
from core.errors import BatchQuotaExceeded, InvalidRequest
from core.jobs import JobStatus

from ..models import Batch, BatchRejection, Job, OutboxMessage
from ..records import (
    BatchLine,
    BatchRecord,
    JobRecord,
    NewFile,
    RejectionRecord,
    RequestCounts,
    UsageRecord,
)
from .bulk import insert_rows
from .files import add_file
from .job_ends import cancel_batch_jobs
from .job_rows import job_record
from .scope import tenant_is
from .submits import ID_PREFIX
from .usage import batch_sums
from .webhooks import stage_batch_event

ACTIVE = (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS, BatchStatus.FINALIZING,
          BatchStatus.CANCELLING)
UNFINISHED_JOB = (JobStatus.QUEUED.value, JobStatus.RUNNING.value)
CHUNK = 5000
# The expanding process publishes a batch's messages itself, right after its commit; the
# outbox relay is the backstop only if that process dies or the broker is down meanwhile,
# so it may not send them before this (it would send tens of thousands twice).
RELAY_BACKSTOP_S = 120.0
Queued = tuple[str, str, str]  # (job id, queue, dispatch token) of a message to send


def _now() -> datetime:
    return datetime.now(UTC)


# Batch ids are minted here; anything else names no batch (and never reaches the database).
BATCH_ID = re.compile(r"batch_[0-9a-f]{32}")


def new_batch_id() -> str:
    return "batch_" + uuid.uuid4().hex


def _lease_free(now: datetime):
    return or_(Batch.lease_expires_at.is_(None), Batch.lease_expires_at < now)


def _unfinished():
    return exists().where(Job.batch_id == Batch.id, Job.status.in_(UNFINISHED_JOB))


def _cursor(s: Session, tenant_id: str | None, after: str):
    """(created_at, id) of the tenant's batch ``after``; an unknown one is an error, never
    a restart at page one (a client paging through would loop)."""
    row = s.execute(select(Batch.created_at, Batch.id).where(
        Batch.id == after, tenant_is(Batch.tenant_id, tenant_id))).first() \
        if BATCH_ID.fullmatch(after) else None
    if row is None:
        raise InvalidRequest("'after' is not a batch of this list (unknown or deleted)",
                             param="after", code="invalid_cursor")
    return row


def _record(b: Batch, counts: RequestCounts | None = None,
            usage: UsageRecord | None = None) -> BatchRecord:
    return BatchRecord(
        id=b.id, tenant_id=b.tenant_id, endpoint=b.endpoint, input_file_id=b.input_file_id,
        completion_window=b.completion_window, status=BatchStatus(b.status),
        metadata=b.metadata_, errors=b.errors, output_file_id=b.output_file_id,
        error_file_id=b.error_file_id,
        counts=counts or RequestCounts(b.total, b.completed, b.failed),
        created_at=b.created_at, expires_at=b.expires_at, in_progress_at=b.in_progress_at,
        finalizing_at=b.finalizing_at, completed_at=b.completed_at, failed_at=b.failed_at,
        expired_at=b.expired_at, cancelling_at=b.cancelling_at, cancelled_at=b.cancelled_at,
        output_expires_after_s=b.output_expires_after_s, usage=usage)


def _counts(s: Session, batches: list[Batch]) -> dict[str, RequestCounts]:
    """Live counts for unfinished batches (finished ones keep the counts they ended
    with): a cancelled, expired or failed job counts as failed, as does a refused line."""
    live = [b for b in batches if BatchStatus(b.status) in ACTIVE]
    if not live:
        return {}
    by_status: dict[str, dict[str, int]] = {b.id: {} for b in live}
    for batch_id, status, n in s.execute(select(Job.batch_id, Job.status, func.count()).where(
            Job.batch_id.in_(list(by_status))).group_by(Job.batch_id, Job.status)):
        by_status[batch_id][status] = n
    return {b.id: RequestCounts(
        total=b.total, completed=by_status[b.id].get(JobStatus.COMPLETED.value, 0),
        failed=b.rejected + sum(by_status[b.id].get(st.value, 0)
                                for st in (JobStatus.FAILED, JobStatus.CANCELLED,
                                           JobStatus.EXPIRED)))
        for b in live}


class BatchRepository:
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    # ---- the API's side ----------------------------------------------------------------

    def create(self, tenant_id: str, *, endpoint: str, input_file_id: str,
               completion_window: str, metadata: dict[str, str] | None,
               max_active: int, output_expires_after_s: int | None = None) -> BatchRecord:
        """A new ``validating`` batch, unless the tenant already has ``max_active``
        unfinished ones (the bulk quota, apart from the interactive ones)."""
        now = _now()
        with self._sessions.begin() as s:
            active = s.scalar(select(func.count()).select_from(
                select(Batch.id).where(Batch.tenant_id == tenant_id,
                                       Batch.status.in_([a.value for a in ACTIVE]))
                .limit(max_active).subquery()))
            if active >= max_active:
                raise BatchQuotaExceeded(f"at most {max_active} unfinished batches per "
                                         "tenant; wait for one to finish")
            batch = Batch(id=new_batch_id(), tenant_id=tenant_id, endpoint=endpoint,
                          input_file_id=input_file_id, completion_window=completion_window,
                          status=BatchStatus.VALIDATING.value, metadata_=metadata, total=0,
                          completed=0, failed=0, rejected=0, created_at=now,
                          expires_at=now + timedelta(seconds=COMPLETION_WINDOWS[
                              completion_window]),
                          output_expires_after_s=output_expires_after_s)
            s.add(batch)
            s.flush()
            return _record(batch, RequestCounts())

    def get(self, batch_id: str, tenant_id: str | None = None) -> BatchRecord | None:
        if not BATCH_ID.fullmatch(batch_id):
            return None
        with self._sessions() as s:
            q = select(Batch).where(Batch.id == batch_id)
            if tenant_id is not None:
                q = q.where(Batch.tenant_id == tenant_id)
            batch = s.scalar(q)
            if batch is None:
                return None
            return _record(batch, _counts(s, [batch]).get(batch.id),
                           batch_sums(s, [batch.id]).get(batch.id))

    def list(self, tenant_id: str | None, *, after: str | None = None, limit: int = 20
             ) -> tuple[list[BatchRecord], bool]:
        """Newest first, cursor on (created_at, id); returns (page, has_more). ``None``:
        every tenant's (storage.repositories.scope)."""
        with self._sessions() as s:
            q = select(Batch).where(tenant_is(Batch.tenant_id, tenant_id))
            if after is not None:
                cursor = _cursor(s, tenant_id, after)
                q = q.where((Batch.created_at < cursor[0])
                            | ((Batch.created_at == cursor[0]) & (Batch.id < cursor[1])))
            rows = s.scalars(q.order_by(Batch.created_at.desc(), Batch.id.desc())
                             .limit(limit + 1)).all()
            counts = _counts(s, list(rows[:limit]))
            sums = batch_sums(s, [b.id for b in rows[:limit]])
            return ([_record(b, counts.get(b.id), sums.get(b.id)) for b in rows[:limit]],
                    len(rows) > limit)

    def cancel(self, batch_id: str, tenant_id: str) -> BatchRecord | None:
        """validating|in_progress -> cancelling, and every queued or running job of the
        batch -> cancelled, in one transaction. Returns the batch as it stands after."""
        now = _now()
        with self._sessions.begin() as s:
            moved = s.execute(update(Batch).where(
                Batch.id == batch_id, Batch.tenant_id == tenant_id,
                Batch.status.in_([BatchStatus.VALIDATING.value,
                                  BatchStatus.IN_PROGRESS.value])).values(
                status=BatchStatus.CANCELLING.value, cancelling_at=now, lease_token=None,
                lease_expires_at=None)).rowcount  # a validator's lease: its CAS fails now
            if moved:
                cancel_batch_jobs(s, batch_id, now)
        return self.get(batch_id, tenant_id)

    # ---- the maintenance side: which batch needs work, and its lease --------------------

    def due(self, limit: int = 20) -> list[tuple[str, BatchStatus]]:
        """Batches a maintenance step should move on, oldest first: to validate, past
        their window, with every job finished, or left mid-way by a process that died."""
        now = _now()
        with self._sessions() as s:
            rows = s.execute(select(Batch.id, Batch.status).where(_lease_free(now), or_(
                Batch.status.in_([BatchStatus.VALIDATING.value, BatchStatus.FINALIZING.value]),
                and_(Batch.status == BatchStatus.IN_PROGRESS.value,
                     or_(Batch.expires_at < now, ~_unfinished())),
                and_(Batch.status == BatchStatus.CANCELLING.value, ~_unfinished())))
                .order_by(Batch.created_at).limit(limit)).all()
            return [(batch_id, BatchStatus(status)) for batch_id, status in rows]

    def take(self, batch_id: str, status: BatchStatus, lease_s: float) -> str | None:
        """The lease on a batch in ``status`` (a cancelling one only once all its jobs
        are finished); None if another process holds it or the status moved on."""
        now = _now()
        q = update(Batch).where(Batch.id == batch_id, Batch.status == status.value,
                                _lease_free(now))
        if status is BatchStatus.CANCELLING:
            q = q.where(~_unfinished())
        return self._lease(q, now, lease_s)

    def begin_finalize(self, batch_id: str, lease_s: float) -> str | None:
        """in_progress -> finalizing with our lease: past the window (its unfinished jobs
        cancelled, the batch to end ``expired``), or once every job has finished."""
        now = _now()
        token = uuid.uuid4().hex
        base = update(Batch).where(Batch.id == batch_id, _lease_free(now),
                                   Batch.status == BatchStatus.IN_PROGRESS.value)
        lease = dict(status=BatchStatus.FINALIZING.value, finalizing_at=now,
                     lease_token=token, lease_expires_at=now + timedelta(seconds=lease_s))
        with self._sessions.begin() as s:
            if s.execute(base.where(Batch.expires_at < now).values(
                    expired_at=now, **lease)).rowcount == 1:
                cancel_batch_jobs(s, batch_id, now, JobStatus.EXPIRED)
                return token
            if s.execute(base.where(~_unfinished()).values(**lease)).rowcount == 1:
                return token
        return None

    def _lease(self, q, now: datetime, lease_s: float) -> str | None:
        token = uuid.uuid4().hex
        with self._sessions.begin() as s:
            res = s.execute(q.values(lease_token=token,
                                     lease_expires_at=now + timedelta(seconds=lease_s)))
            return token if res.rowcount == 1 else None

    def renew(self, batch_id: str, token: str, lease_s: float) -> bool:
        with self._sessions.begin() as s:
            return s.execute(update(Batch).where(
                Batch.id == batch_id, Batch.lease_token == token).values(
                lease_expires_at=_now() + timedelta(seconds=lease_s))).rowcount == 1

    # ---- validation ---------------------------------------------------------------------

    def expand(self, batch_id: str, token: str, lines: Iterable[BatchLine]) -> list[Queued] | None:
        """validating -> in_progress with every job, its render message (outbox) and every
        refused line, in one transaction: all of them or, if ``lines`` raises, none.
        Returns what to publish; None if the batch is no longer ours to expand."""
        now = _now()
        with self._sessions.begin() as s:
            if s.execute(update(Batch).where(
                    Batch.id == batch_id, Batch.lease_token == token,
                    Batch.status == BatchStatus.VALIDATING.value).values(
                    status=BatchStatus.IN_PROGRESS.value, in_progress_at=now,
                    lease_token=None, lease_expires_at=None)).rowcount != 1:
                return None
            sink = _Sink(s, batch_id, now)
            for line in lines:
                sink.add(line)
            sink.flush()
            s.execute(update(Batch).where(Batch.id == batch_id).values(
                total=sink.total, rejected=sink.rejected))
            return sink.queued

    def fail(self, batch_id: str, token: str, errors: list[dict]) -> bool:
        """validating -> failed with the file's errors (nothing was created)."""
        now = _now()
        with self._sessions.begin() as s:
            tenant_id = s.scalar(update(Batch).where(
                Batch.id == batch_id, Batch.lease_token == token,
                Batch.status == BatchStatus.VALIDATING.value).values(
                status=BatchStatus.FAILED.value, failed_at=now, errors=errors,
                lease_token=None, lease_expires_at=None).returning(Batch.tenant_id))
            if tenant_id is None:
                return False
            stage_batch_event(s, tenant_id, batch_id, EVENTS[BatchStatus.FAILED])
            return True

    def mark_published(self, batch_id: str) -> None:
        """Every render message of the batch's jobs is with the broker (one statement)."""
        with self._sessions.begin() as s:
            s.execute(update(OutboxMessage).where(
                OutboxMessage.job_id.in_(select(Job.id).where(Job.batch_id == batch_id)),
                OutboxMessage.published_at.is_(None)).values(published_at=_now()))

    # ---- finalization -------------------------------------------------------------------

    def results(self, batch_id: str, page: int = 1000
                ) -> Iterator[tuple[int, str, JobRecord]]:
        """(line, custom_id, job) of every job of the batch, in line order, a page at a
        time (no transaction held across pages)."""
        last = -1
        while True:
            with self._sessions() as s:
                rows = s.scalars(select(Job).where(
                    Job.batch_id == batch_id, Job.batch_index > last)
                    .order_by(Job.batch_index).limit(page)).all()
                found = [(j.batch_index, j.custom_id, job_record(j)) for j in rows]
            yield from found
            if len(found) < page:
                return
            last = found[-1][0]

    def rejections(self, batch_id: str) -> list[RejectionRecord]:
        with self._sessions() as s:
            return [RejectionRecord(line=r.line, custom_id=r.custom_id,
                                    status_code=r.status_code, body=r.body)
                    for r in s.scalars(select(BatchRejection).where(
                        BatchRejection.batch_id == batch_id).order_by(BatchRejection.line))]

    def finish(self, batch_id: str, token: str, output: NewFile | None,
               error: NewFile | None) -> BatchRecord | None:
        """finalizing -> completed | expired, cancelling -> cancelled, with the output and
        error files, the final counts and the webhook event, in one transaction."""
        now = _now()
        with self._sessions.begin() as s:
            batch = s.scalar(select(Batch).where(Batch.id == batch_id,
                                                 Batch.lease_token == token))
            if batch is None or BatchStatus(batch.status) not in (
                    BatchStatus.FINALIZING, BatchStatus.CANCELLING):
                return None
            final = ending(BatchStatus(batch.status), batch.expired_at is not None)
            counts = _counts(s, [batch])[batch.id]
            if s.execute(update(Batch).where(
                    Batch.id == batch_id, Batch.lease_token == token,
                    Batch.status == batch.status).values(
                    status=final.value, lease_token=None, lease_expires_at=None,
                    completed=counts.completed, failed=counts.failed,
                    **{_STAMP[final]: now})).rowcount != 1:
                return None
            files = {name: add_file(s, new, now).id
                     for name, new in (("output_file_id", output), ("error_file_id", error))
                     if new is not None}
            if files:
                s.execute(update(Batch).where(Batch.id == batch_id).values(**files))
            stage_batch_event(s, batch.tenant_id, batch_id, EVENTS[final])
            s.flush()
            s.refresh(batch)
            return _record(batch)


_STAMP = {BatchStatus.COMPLETED: "completed_at", BatchStatus.EXPIRED: "expired_at",
          BatchStatus.CANCELLED: "cancelled_at"}


class _Sink:
    """Collects checked lines into job, outbox and rejection rows, inserted a chunk at a
    time so a large batch never holds all its rows in memory."""

    def __init__(self, s: Session, batch_id: str, now: datetime) -> None:
        self.s, self.batch_id, self.now = s, batch_id, now
        self.backstop = now + timedelta(seconds=RELAY_BACKSTOP_S)
        self.jobs: list[dict] = []
        self.outbox: list[dict] = []
        self.refused: list[dict] = []
        self.queued: list[Queued] = []
        self.total = self.rejected = 0

    def add(self, line: BatchLine) -> None:
        self.total += 1
        if line.job is None:
            self.rejected += 1
            self.refused.append(dict(batch_id=self.batch_id, line=line.index,
                                     custom_id=line.custom_id,
                                     status_code=line.rejected.status_code,
                                     body=line.rejected.body))
        else:
            self._job(line)
        if len(self.jobs) + len(self.refused) >= CHUNK:
            self.flush()

    def _job(self, line: BatchLine) -> None:
        new, now = line.job, self.now
        # A UUID's 32 hex digits, as JobRepository and new_token mint them, for less.
        job_id, token = ID_PREFIX[new.kind] + secrets.token_hex(16), secrets.token_hex(16)
        self.jobs.append(dict(
            id=job_id, tenant_id=new.tenant_id, kind=new.kind.value, model=new.model,
            pipeline=new.pipeline, status=JobStatus.QUEUED.value, progress=0,
            request=new.request, metadata=new.metadata, attempts=0,
            max_attempts=new.max_attempts, created_at=now, updated_at=now,
            dispatch_token=token, batch_id=self.batch_id, batch_index=line.index,
            custom_id=line.custom_id))
        self.outbox.append(dict(topic="render", job_id=job_id, queue=new.queue,
                                payload={"job_id": job_id, "token": token, "lane": BULK_LANE},
                                created_at=now, available_at=self.backstop))
        self.queued.append((job_id, new.queue, token))

    def flush(self) -> None:
        insert_rows(self.s, Job.__table__, self.jobs)
        insert_rows(self.s, OutboxMessage.__table__, self.outbox)
        insert_rows(self.s, BatchRejection.__table__, self.refused)
        self.jobs, self.outbox, self.refused = [], [], []
