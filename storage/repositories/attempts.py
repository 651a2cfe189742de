"""Each job's attempts, for its timeline: opened by the claim, closed by the transition
that ends the attempt, always inside the job repository's transaction for that
transition (so the history never disagrees with the job row)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.orm import Session

from core.errors import MESSAGE_LIMIT

from ..models import Job, JobAttempt, UTCDateTime
from ..records import JobAttemptRecord

COMPLETED, FAILED, RETRIED, CANCELLED, EXPIRED = (
    "completed", "failed", "retried", "cancelled", "expired")

# Built once, like the claim it follows (a worker claims often).
_OPEN = insert(JobAttempt).values(
    job_id=bindparam("job_id"), attempt=bindparam("attempt"),
    worker_id=bindparam("worker_id"), claimed_at=bindparam("now", type_=UTCDateTime()))


def open_attempt(s: Session, job_id: str, attempt: int, worker_id: str | None,
                 now: datetime) -> None:
    s.connection().execute(_OPEN, {"job_id": job_id, "attempt": attempt,
                                   "worker_id": worker_id, "now": now})


def close_attempt(s: Session, job_id: str, now: datetime, outcome: str,
                  code: str | None = None, message: str | None = None,
                  render: tuple[float, str | None] | None = None) -> None:
    """End the job's open attempt, if it has one (a queued job has none); ``render``:
    the worker's (wall seconds in the pipeline, device) for it, when a worker ends it."""
    timing = {"render_s": render[0], "device": render[1]} if render else {}
    s.execute(update(JobAttempt).where(JobAttempt.job_id == job_id,
                                       JobAttempt.ended_at.is_(None)).values(
        ended_at=now, outcome=outcome, error_code=code[:64] if code else None,
        error_message=message[:MESSAGE_LIMIT] if message else None, **timing))


def record_render(s: Session, job_id: str, attempt: int, render_s: float,
                  device: str | None) -> bool:
    """A worker's time for an attempt that someone else ended (a cancel): written once,
    never over a time the worker already recorded. True if it was written."""
    return s.execute(update(JobAttempt).where(
        JobAttempt.job_id == job_id, JobAttempt.attempt == attempt,
        JobAttempt.render_s.is_(None)).values(render_s=render_s, device=device)).rowcount == 1


def close_batch_attempts(s: Session, batch_id: str, now: datetime) -> None:
    """A batch's cancel ends the open attempts of all its jobs at once."""
    s.execute(update(JobAttempt).where(
        JobAttempt.ended_at.is_(None),
        JobAttempt.job_id.in_(select(Job.id).where(Job.batch_id == batch_id))).values(
        ended_at=now, outcome=CANCELLED))


def attempts_of(s: Session, job_id: str) -> list[JobAttemptRecord]:
    rows = s.scalars(select(JobAttempt).where(JobAttempt.job_id == job_id)
                     .order_by(JobAttempt.attempt)).all()
    return [JobAttemptRecord(attempt=a.attempt, worker_id=a.worker_id,
                             claimed_at=a.claimed_at, ended_at=a.ended_at, outcome=a.outcome,
                             error_code=a.error_code, error_message=a.error_message,
                             render_s=a.render_s, device=a.device)
            for a in rows]
