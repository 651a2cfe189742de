"""Jobs and their outputs. Every status change is one compare-and-set UPDATE here.

``WHERE id = ? AND status = ?`` (plus the attempt number for a worker's writes) means
a second worker, a late duplicate message or a worker whose lease was reclaimed
loses the race and changes nothing. The transitions live by family in ``job_claims``,
``job_ends`` and ``job_sweeps``; this module submits, reads and lists.
"""

from __future__ import annotations

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError

from core.errors import TooManyRequests
from core.jobs import JobKind, JobStatus

from ..models import Job
from ..records import JobAttemptRecord, JobFilter, JobRecord, NewJob, OutboxRecord
from . import attempts as history
from .job_claims import ClaimTransitions
from .job_ends import EndTransitions
from .job_rows import filtered, job_record, page_after, utcnow
from .job_sweeps import JobSweeps
from .outbox import _record as outbox_record
from .outbox import add_render, new_token
from .submits import Submitted, insert_many, new_job_id
from .webhooks import subscribe_job


class JobRepository(ClaimTransitions, EndTransitions, JobSweeps):
    def create(self, new: NewJob) -> tuple[JobRecord, OutboxRecord | None]:
        """Insert the job and its render message in one transaction.

        With an idempotency key already used by the tenant, returns the existing job
        and no message (nothing new to publish), even when the quotas are full.
        """
        now = utcnow()
        job = Job(id=new.id or new_job_id(new.kind), tenant_id=new.tenant_id,
                  kind=new.kind.value, model=new.model, pipeline=new.pipeline,
                  status=JobStatus.QUEUED.value, progress=0, request=new.request,
                  metadata_=new.metadata, idempotency_key=new.idempotency_key, attempts=0,
                  max_attempts=new.max_attempts, created_at=now, updated_at=now,
                  dispatch_token=new_token(), start_by=new.start_by, max_run_s=new.max_run_s)
        try:
            with self._sessions.begin() as s:
                if self._quotas is not None:
                    self._quotas.admit(s, tenant_id=new.tenant_id, lane=new.lane,
                                       pipeline=new.pipeline)
                s.add(job)
                s.flush()
                subscribe_job(s, job.id, new.webhook)
                msg = add_render(s, job.id, new.queue, job.dispatch_token)
                return job_record(job), outbox_record(msg)
        except (IntegrityError, TooManyRequests):
            if new.idempotency_key is None:
                raise
            existing = self.get_by_idempotency_key(new.tenant_id, new.idempotency_key)
            if existing is None:
                raise
            return existing, None

    def create_many(self, news: list[NewJob]) -> list[Submitted]:
        """Group commit of submits without idempotency keys (``submits.insert_many``)."""
        return insert_many(self._sessions, self._quotas, news)

    def get_by_idempotency_key(self, tenant_id: str, key: str) -> JobRecord | None:
        return self._one(select(Job).where(Job.tenant_id == tenant_id,
                                           Job.idempotency_key == key))

    def states(self, job_ids: list[str]) -> dict[str, tuple[str, int, int]]:
        """(status, attempts, progress) of each job that exists: all an API process's
        watchers need to tell whether their job changed, in one query for all of them
        (the live resync, api/live.py)."""
        if not job_ids:
            return {}
        with self._reads() as s:
            rows = s.execute(select(Job.id, Job.status, Job.attempts, Job.progress)
                             .where(Job.id.in_(job_ids)))
            return {r.id: (r.status, r.attempts, r.progress) for r in rows}

    def list(self, tenant_id: str, *, after: str | None = None, limit: int = 20,
             order: str = "desc", status: JobStatus | None = None,
             kind: JobKind | None = None) -> tuple[list[JobRecord], bool]:
        """Cursor pagination on (created_at, id); returns (page, has_more)."""
        return self.find(JobFilter(tenant_id, status=status, kind=kind), after=after,
                         limit=limit, order=order)

    def find(self, f: JobFilter, *, after: str | None = None, limit: int = 20,
             order: str = "desc") -> tuple[list[JobRecord], bool]:
        """``list`` with every filter (``f.tenant_id`` None: every tenant's jobs)."""
        with self._sessions() as s:
            q = filtered(select(Job), f)
            if after is not None:
                q = q.where(page_after(s, f.tenant_id, after, order))
            if order == "desc":
                q = q.order_by(Job.created_at.desc(), Job.id.desc())
            else:
                q = q.order_by(Job.created_at.asc(), Job.id.asc())
            rows = s.scalars(q.limit(limit + 1)).all()
            return [job_record(j) for j in rows[:limit]], len(rows) > limit

    # ---- worker transitions ----------------------------------------------------------

    def attempts(self, job_id: str) -> list[JobAttemptRecord]:
        """The job's attempts, oldest first (its timeline)."""
        with self._sessions() as s:
            return history.attempts_of(s, job_id)

    def delete(self, job_id: str, tenant_id: str) -> bool:
        with self._sessions.begin() as s:
            return s.execute(delete(Job).where(
                Job.id == job_id, Job.tenant_id == tenant_id)).rowcount == 1
