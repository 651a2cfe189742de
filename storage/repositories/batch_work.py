"""The maintenance side of batches: which batch needs work and the lease on it, the
expansion of a validated input into jobs (bulk inserts, a chunk at a time), and the
terminal transitions, each with its webhook event in the same transaction."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta

from sqlalchemy import and_, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from core.batches import BULK_LANE, EVENTS, BatchStatus, ending
from core.jobs import JobStatus

from ..models import Batch, BatchRejection, Job, OutboxMessage
from ..records import BatchLine, BatchRecord, JobRecord, NewFile, RejectionRecord
from .batch_rows import batch_record, lease_free, live_counts, unfinished, utcnow
from .bulk import insert_rows
from .files import add_file
from .job_ends import cancel_batch_jobs
from .job_rows import job_record
from .submits import ID_PREFIX
from .webhooks import stage_batch_event

CHUNK = 5000
# The expanding process publishes a batch's messages itself, right after its commit; the
# outbox relay is the backstop only if that process dies or the broker is down meanwhile,
# so it may not send them before this (it would send tens of thousands twice).
RELAY_BACKSTOP_S = 120.0
Queued = tuple[str, str, str]  # (job id, queue, dispatch token) of a message to send


class BatchWork:
    """``BatchRepository``'s maintenance side (its ``_sessions``)."""

    _sessions: sessionmaker[Session]

    def due(self, limit: int = 20) -> list[tuple[str, BatchStatus]]:
        """Batches a maintenance step should move on, oldest first: to validate, past
        their window, with every job finished, or left mid-way by a process that died."""
        now = utcnow()
        with self._sessions() as s:
            rows = s.execute(select(Batch.id, Batch.status).where(lease_free(now), or_(
                Batch.status.in_([BatchStatus.VALIDATING.value, BatchStatus.FINALIZING.value]),
                and_(Batch.status == BatchStatus.IN_PROGRESS.value,
                     or_(Batch.expires_at < now, ~unfinished())),
                and_(Batch.status == BatchStatus.CANCELLING.value, ~unfinished())))
                .order_by(Batch.created_at).limit(limit)).all()
            return [(batch_id, BatchStatus(status)) for batch_id, status in rows]

    def take(self, batch_id: str, status: BatchStatus, lease_s: float) -> str | None:
        """The lease on a batch in ``status`` (a cancelling one only once all its jobs
        are finished); None if another process holds it or the status moved on."""
        now = utcnow()
        q = update(Batch).where(Batch.id == batch_id, Batch.status == status.value,
                                lease_free(now))
        if status is BatchStatus.CANCELLING:
            q = q.where(~unfinished())
        return self._lease(q, now, lease_s)

    def begin_finalize(self, batch_id: str, lease_s: float) -> str | None:
        """in_progress -> finalizing with our lease: past the window (its unfinished jobs
        cancelled, the batch to end ``expired``), or once every job has finished."""
        now = utcnow()
        token = uuid.uuid4().hex
        base = update(Batch).where(Batch.id == batch_id, lease_free(now),
                                   Batch.status == BatchStatus.IN_PROGRESS.value)
        lease = dict(status=BatchStatus.FINALIZING.value, finalizing_at=now,
                     lease_token=token, lease_expires_at=now + timedelta(seconds=lease_s))
        with self._sessions.begin() as s:
            if s.execute(base.where(Batch.expires_at < now).values(
                    expired_at=now, **lease)).rowcount == 1:
                cancel_batch_jobs(s, batch_id, now, JobStatus.EXPIRED)
                return token
            if s.execute(base.where(~unfinished()).values(**lease)).rowcount == 1:
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
                lease_expires_at=utcnow() + timedelta(seconds=lease_s))).rowcount == 1

    # ---- validation ---------------------------------------------------------------------

    def expand(self, batch_id: str, token: str, lines: Iterable[BatchLine]) -> list[Queued] | None:
        """validating -> in_progress with every job, its render message (outbox) and every
        refused line, in one transaction: all of them or, if ``lines`` raises, none.
        Returns what to publish; None if the batch is no longer ours to expand."""
        now = utcnow()
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
        now = utcnow()
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
                OutboxMessage.published_at.is_(None)).values(published_at=utcnow()))

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
        now = utcnow()
        with self._sessions.begin() as s:
            batch = s.scalar(select(Batch).where(Batch.id == batch_id,
                                                 Batch.lease_token == token))
            if batch is None or BatchStatus(batch.status) not in (
                    BatchStatus.FINALIZING, BatchStatus.CANCELLING):
                return None
            final = ending(BatchStatus(batch.status), batch.expired_at is not None)
            counts = live_counts(s, [batch])[batch.id]
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
            return batch_record(batch)


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
