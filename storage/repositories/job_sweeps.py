"""What the maintenance sweeps read and write: expired leases, queued jobs whose message
was lost, outputs past their retention, finished records that may go, and the keys the
orphan sweep must keep.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import delete, or_, select, update

from core.jobs import TERMINAL, JobStatus

from ..models import OUTPUTS_KEPT, QUEUED, Job, OutboxMessage
from ..records import JobObjects, JobRecord, OutboxRecord
from .job_rows import JobStore, job_record, owned_keys, utcnow
from .outbox import _record as outbox_record
from .outbox import add_render, new_token


class JobSweeps(JobStore):
    def expired_leases(self, limit: int = 100) -> list[JobRecord]:
        with self._sessions() as s:
            rows = s.scalars(select(Job).where(
                Job.status == JobStatus.RUNNING.value,
                Job.lease_expires_at < utcnow()).order_by(Job.lease_expires_at)
                .limit(limit)).all()
            return [job_record(j) for j in rows]

    def stale_queued(self, older_than_s: float, limit: int = 100) -> list[JobRecord]:
        """Queued jobs whose render message went out (and became due) more than
        ``older_than_s`` ago: candidates for a lost message. A job whose message is still
        in the outbox belongs to the relay, not here."""
        cutoff = utcnow() - timedelta(seconds=older_than_s)
        pending = select(OutboxMessage.id).where(
            OutboxMessage.job_id == Job.id,
            or_(OutboxMessage.published_at.is_(None), OutboxMessage.available_at > cutoff))
        with self._sessions() as s:
            # the status as the partial index's own predicate (ix_jobs_queued_updated)
            rows = s.scalars(select(Job).where(
                QUEUED, Job.updated_at < cutoff,
                ~pending.exists()).order_by(Job.updated_at).limit(limit)).all()
            return [job_record(j) for j in rows]

    def republish(self, job: JobRecord, queue: str) -> OutboxRecord | None:
        """A fresh render message (and token) for a job whose message was lost. A CAS on the
        token the sweeper saw, so two sweepers don't both re-send it, and the lost message,
        should it turn up after all, can no longer claim the job."""
        now, token = utcnow(), new_token()
        seen = (Job.dispatch_token.is_(None) if job.dispatch_token is None
                else Job.dispatch_token == job.dispatch_token)
        with self._sessions.begin() as s:
            res = s.execute(update(Job).where(
                Job.id == job.id, Job.status == JobStatus.QUEUED.value, seen).values(
                updated_at=now, dispatch_token=token))
            if res.rowcount != 1:
                return None
            return outbox_record(add_render(s, job.id, queue, token))

    # ---- retention -------------------------------------------------------------------

    def outputs_to_expire(self, limit: int = 100) -> list[JobRecord]:
        """Completed jobs past ``expires_at`` whose objects are not deleted yet: a range of
        ``ix_jobs_outputs_due``, which holds only those not deleted yet."""
        with self._sessions() as s:
            rows = s.scalars(select(Job).where(
                OUTPUTS_KEPT, Job.expires_at <= utcnow())
                .order_by(Job.expires_at).limit(limit)).all()
            return [job_record(j) for j in rows]

    def mark_outputs_deleted(self, job_id: str) -> bool:
        now = utcnow()
        with self._sessions.begin() as s:
            return s.execute(update(Job).where(Job.id == job_id).values(
                outputs_deleted_at=now, updated_at=now)).rowcount == 1

    def finished_before(self, older_than_s: float, limit: int = 100) -> list[JobRecord]:
        """Jobs that ended more than ``older_than_s`` ago: their records may go."""
        cutoff = utcnow() - timedelta(seconds=older_than_s)
        with self._sessions() as s:
            rows = s.scalars(select(Job).where(
                Job.completed_at < cutoff, Job.status.in_([t.value for t in TERMINAL]))
                .order_by(Job.completed_at).limit(limit)).all()
            return [job_record(j) for j in rows]

    def delete_finished(self, job_id: str) -> bool:
        with self._sessions.begin() as s:
            return s.execute(delete(Job).where(
                Job.id == job_id, Job.status.in_([t.value for t in TERMINAL]))).rowcount == 1

    def live_keys(self, job_ids: list[str]) -> dict[str, JobObjects]:
        """For the orphan sweep: per existing job, the object keys it still owns, or (while
        it is queued or running, and anything under its prefix may be in flight) the first
        attempt that may still write. A job missing from the answer no longer exists:
        everything under its prefix is orphaned."""
        if not job_ids:
            return {}
        with self._sessions() as s:
            rows = s.scalars(select(Job).where(Job.id.in_(job_ids))).all()
            return {j.id: owned_keys(j) for j in rows}
