"""The transitions that end an attempt: complete, fail, a deadline's end, a retry or a
hand-back to the queue, and a cancel. Each is one compare-and-set in one transaction with
its event, its attempt's end and its usage record.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from core.errors import MESSAGE_LIMIT
from core.jobs import JobKind, JobStatus

from ..models import Job, Output
from ..records import JobRecord, OutboxRecord, OutputRecord
from . import attempts as history
from . import hotpath
from . import usage as metering
from .job_rows import JobStore, utcnow
from .outbox import _record as outbox_record
from .outbox import add_render, new_token
from .webhooks import new_event_id, stage_job_event, withdraw_event


def cancel_batch_jobs(s: Session, batch_id: str, now: datetime,
                      status: JobStatus = JobStatus.CANCELLED) -> int:
    """queued|running -> cancelled (or ``expired``: the batch's window passed) for every
    unfinished job of a batch, in one statement of the caller's transaction (a running
    job's worker stops at its next heartbeat, and reports its time then). The batch's own
    event reports it; no per-job events. The jobs first, then their open attempts: the
    order a worker's transitions lock them in, so the two never deadlock. The jobs that
    ran get their usage record here, as a job cancelled alone does (a worker's time
    reported later rewrites it); those that never ran have none."""
    ended = s.execute(update(Job).where(
        Job.batch_id == batch_id,
        Job.status.in_([JobStatus.QUEUED.value, JobStatus.RUNNING.value])).values(
        status=status.value, completed_at=now, updated_at=now,
        lease_expires_at=None).returning(Job.id, Job.attempts)).all()
    history.close_batch_attempts(s, batch_id, now)
    for job_id, attempts in ended:
        if attempts:
            metering.settle(s, job_id, now)
    return len(ended)



def _ended_event(kind: str, status: JobStatus) -> str:
    """The webhook event of a job that ended by a deadline: a video reports what
    ``/v1/videos`` shows (``failed``); speech its own status where an event has it."""
    if kind == JobKind.VIDEO.value or status is JobStatus.EXPIRED:
        return "failed"
    return status.value


class EndTransitions(JobStore):
    def complete(self, job_id: str, attempt: int, outputs: list[OutputRecord],
                 output_ttl_s: float, render: tuple[float, str | None] | None = None) -> bool:
        """Outputs + running -> completed + the usage record in one transaction (one
        statement on PostgreSQL, ``hotpath.complete()``); nothing written if we lost. A
        running job has no outputs (they are written only here, and completed is final).
        The outputs expire ``output_ttl_s`` after completion; ``render``: the worker's
        (seconds in the pipeline, device) for this attempt.

        A dropped connection is ServiceUnavailable (retryable): the caller may try again.
        """
        now = utcnow()
        if self._dialect == "postgresql":
            with self._engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
                return c.execute(hotpath.complete(), {
                    "p_job": job_id, "p_attempt": attempt, "now": now,
                    "p_expires": now + timedelta(seconds=output_ttl_s),
                    "p_outputs": [asdict(o) for o in outputs], "p_event": new_event_id(),
                    "timed": render is not None, "p_render": render and render[0],
                    "p_device": render and render[1], **hotpath.media(outputs)}
                ).first() is not None
        with self._sessions.begin() as s:
            res = s.execute(self._running(job_id, attempt).values(
                status=JobStatus.COMPLETED.value, progress=100, completed_at=now,
                updated_at=now, lease_expires_at=None,
                expires_at=now + timedelta(seconds=output_ttl_s)))
            if res.rowcount != 1:
                return False
            s.add_all(Output(job_id=job_id, created_at=now, **asdict(o)) for o in outputs)
            stage_job_event(s, job_id, "completed")
            history.close_attempt(s, job_id, now, history.COMPLETED, render=render)
            metering.settle(s, job_id, now)
            return True

    def fail(self, job_id: str, code: str, message: str, *, attempt: int | None = None,
             from_status: JobStatus = JobStatus.RUNNING, only_if_expired: bool = False,
             render: tuple[float, str | None] | None = None) -> bool:
        now = utcnow()
        q = update(Job).where(Job.id == job_id, Job.status == from_status.value)
        if attempt is not None:
            q = q.where(Job.attempts == attempt)
        if only_if_expired:
            q = q.where(Job.lease_expires_at < now)
        with self._sessions.begin() as s:
            failed = s.execute(q.values(
                status=JobStatus.FAILED.value, error_code=code[:64],
                error_message=message[:MESSAGE_LIMIT], completed_at=now, updated_at=now,
                lease_expires_at=None)).rowcount == 1
            if failed:
                stage_job_event(s, job_id, "failed")
                history.close_attempt(s, job_id, now, history.FAILED, code, message, render)
                metering.settle(s, job_id, now)
            return failed

    def cancel_overdue(self, job_id: str, attempt: int, message: str,
                       render: tuple[float, str | None] | None = None) -> bool:
        """running -> cancelled with ``deadline_exceeded``: the attempt ran past the
        caller's ``max_run_s``. Never retried."""
        return self._end(self._running(job_id, attempt), job_id, JobStatus.CANCELLED,
                         "deadline_exceeded", message, history.CANCELLED, render)

    def expire_claimed(self, job_id: str, attempt: int, message: str) -> bool:
        """running -> expired for an attempt claimed after the job's start deadline: it
        never runs. The claim's ``started`` event, not yet sent, is withdrawn."""
        return self._end(self._running(job_id, attempt), job_id, JobStatus.EXPIRED,
                         "start_deadline_exceeded", message, history.EXPIRED, (0.0, None),
                         withdraw_started=True)

    def expire_queued(self, limit: int = 100) -> list[str]:
        """queued -> expired for jobs whose start deadline has passed (the maintenance
        sweep), one compare-and-set each; the ids it expired."""
        now = utcnow()
        with self._sessions() as s:
            due = s.scalars(select(Job.id).where(
                Job.status == JobStatus.QUEUED.value, Job.start_by.is_not(None),
                Job.start_by < now, Job.started_at.is_(None))  # a retry has started
                .order_by(Job.start_by).limit(limit)).all()
        return [job_id for job_id in due if self._end(
            update(Job).where(Job.id == job_id, Job.status == JobStatus.QUEUED.value,
                              Job.started_at.is_(None)),
            job_id, JobStatus.EXPIRED, "start_deadline_exceeded",
            "the job did not start before its start deadline", history.EXPIRED, None)]

    def _end(self, q, job_id: str, status: JobStatus, code: str, message: str,
             outcome: str, render: tuple[float, str | None] | None,
             withdraw_started: bool = False) -> bool:
        """A deadline's end of the job (``q`` says which row), its event, its attempt's
        end and its usage record, in one transaction."""
        now = utcnow()
        with self._sessions.begin() as s:
            kind = s.scalar(q.values(
                status=status.value, error_code=code, error_message=message[:MESSAGE_LIMIT],
                completed_at=now, updated_at=now, lease_expires_at=None).returning(Job.kind))
            if kind is None:
                return False
            if withdraw_started:
                withdraw_event(s, job_id, f"{kind}.started")
            stage_job_event(s, job_id, _ended_event(kind, status))
            history.close_attempt(s, job_id, now, outcome, code, message, render)
            metering.settle(s, job_id, now)
            return True

    def record_render(self, job_id: str, attempt: int, render_s: float,
                      device: str | None) -> bool:
        """A worker's time for an attempt that ended without it (cancelled): recorded on
        the attempt, and the job's usage record rewritten if the job has ended."""
        now = utcnow()
        with self._sessions.begin() as s:
            if not history.record_render(s, job_id, attempt, render_s, device):
                return False
            status = s.scalar(select(Job.status).where(Job.id == job_id))
            if status is not None and JobStatus(status).terminal:
                metering.settle(s, job_id, now)
            return True

    def requeue(self, job_id: str, attempt: int, *, queue: str, delay_s: float,
                code: str, message: str, only_if_expired: bool = False,
                render: tuple[float, str | None] | None = None) -> OutboxRecord | None:
        """running -> queued for a retry, with its render message, in one transaction.

        ``only_if_expired`` (the reaper) also requires the lease to have run out, so a
        heartbeat that lands between the reaper's read and this write keeps the job.
        """
        q = self._running(job_id, attempt)
        if only_if_expired:
            q = q.where(Job.lease_expires_at < utcnow())
        return self._to_queue(q, job_id, queue, delay_s, code=code, message=message,
                              render=render)

    def hand_back(self, job_id: str, attempt: int, *, queue: str) -> OutboxRecord | None:
        """running -> queued at once, from a worker that stops (drain) before the job is
        done: the lease released, a fresh dispatch token and render message, and one more
        attempt allowed, since this one did not fail. The attempt number still grows at
        the next claim, so the stopping worker's late writes (fenced by it) change
        nothing."""
        return self._to_queue(self._running(job_id, attempt), job_id, queue, 0.0,
                              code="handed_back", message="the worker stopped before the "
                              "job was done and handed it back", max_attempts=Job.max_attempts + 1)

    def _to_queue(self, q, job_id: str, queue: str, delay_s: float, *, code: str,
                  message: str, render: tuple[float, str | None] | None = None,
                  **values: Any) -> OutboxRecord | None:
        """running -> queued (``q`` says which row) with a new token, and its render
        message in the same transaction."""
        now, token = utcnow(), new_token()
        ready_at = now + timedelta(seconds=delay_s) if delay_s > 0 else None
        with self._sessions.begin() as s:
            res = s.execute(q.values(
                status=JobStatus.QUEUED.value, worker_id=None, lease_expires_at=None,
                progress=0, updated_at=now, ready_at=ready_at, error_code=code[:64],
                error_message=message[:MESSAGE_LIMIT], dispatch_token=token, **values))
            if res.rowcount != 1:
                return None
            history.close_attempt(s, job_id, now, history.RETRIED, code, message, render)
            return outbox_record(add_render(s, job_id, queue, token, delay_s))

    def cancel(self, job_id: str, tenant_id: str) -> JobRecord | None:
        """queued|running -> cancelled. Returns the job as it stands afterwards."""
        now = utcnow()
        with self._sessions.begin() as s:
            if s.execute(update(Job).where(
                    Job.id == job_id, Job.tenant_id == tenant_id,
                    Job.status.in_([JobStatus.QUEUED.value, JobStatus.RUNNING.value])).values(
                    status=JobStatus.CANCELLED.value, completed_at=now, updated_at=now,
                    lease_expires_at=None)).rowcount == 1:
                stage_job_event(s, job_id, "cancelled")
                history.close_attempt(s, job_id, now, history.CANCELLED)
                metering.settle(s, job_id, now)
        return self.get(job_id, tenant_id)
