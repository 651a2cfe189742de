"""Claims and heartbeats: queued -> running with a lease, and the lease kept alive.

Each statement is built once and run with parameters; on PostgreSQL the fair claim is one
statement (``hotpath.claim``) after the lane's lock.
"""

from __future__ import annotations

from datetime import timedelta
from functools import cache
from typing import Any

from sqlalchemy import bindparam, func, update

from core.jobs import JobStatus

from ..models import Job, UTCDateTime
from ..records import JobRecord
from . import attempts as history
from . import fair, hotpath
from .job_rows import JobStore, job_record, utcnow
from .webhooks import new_event_id, stage_job_event


def _claim_statement(with_token: bool):
    """queued -> running for ``:job_id`` (with ``:token``, only for the job's current
    dispatch token), returning the row: built once, run with parameters."""
    q = update(Job).where(Job.id == bindparam("job_id"),
                          Job.status == JobStatus.QUEUED.value)
    if with_token:
        q = q.where(Job.dispatch_token == bindparam("token"))
    return q.values(
        status=JobStatus.RUNNING.value, attempts=Job.attempts + 1,
        worker_id=bindparam("worker_id"), lease_expires_at=bindparam("lease", type_=UTCDateTime()),
        updated_at=bindparam("now", type_=UTCDateTime()),
        started_at=func.coalesce(Job.started_at, bindparam("now", type_=UTCDateTime())),
        error_code=None, error_message=None).returning(*fair.CLAIMED)


_CLAIM = (_claim_statement(False), _claim_statement(True))


@cache
def _fair_claim(lane: str):
    return fair.claim_statement(lane, fair.CLAIMED)


def _heartbeat_statement(with_progress: bool):
    """Extend the lease of ``:job_id`` while it is running attempt ``:attempt`` (and set
    ``:new_progress``): built once, like the claim; a worker sends one every few seconds
    and one before each upload."""
    q = update(Job).where(Job.id == bindparam("job_id"),
                          Job.status == JobStatus.RUNNING.value,
                          Job.attempts == bindparam("attempt")).values(
        lease_expires_at=bindparam("lease", type_=UTCDateTime()),
        updated_at=bindparam("now", type_=UTCDateTime()))
    return q.values(progress=bindparam("new_progress")) if with_progress else q


_HEARTBEAT = (_heartbeat_statement(False), _heartbeat_statement(True))


class ClaimTransitions(JobStore):
    def claim(self, job_id: str, worker_id: str, lease_s: float,
              token: str | None = None) -> JobRecord | None:
        """queued -> running, attempts + 1, with a lease. None if someone else won, or if
        ``token`` is not the job's current dispatch token (a superseded message)."""
        now = utcnow()
        params = {"job_id": job_id, "worker_id": worker_id, "now": now,
                  "lease": now + timedelta(seconds=lease_s)}
        if token is not None:
            params["token"] = token
        with self._sessions.begin() as s:
            # One round trip: the compare-and-set hands back the row it wrote.
            job = s.connection().execute(_CLAIM[token is not None], params).one_or_none()
            if job is None:
                return None
            stage_job_event(s, job_id, "started", job)
            history.open_attempt(s, job_id, job.attempts, worker_id, now)
            # Outputs are written only with ``completed``: a job leaving ``queued`` has none.
            return job_record(job, outputs=())

    def claim_next(self, token: str, worker_id: str, lease_s: float) -> JobRecord | None:
        """A render message carrying ``token`` arrived: claim the fairest ready job of
        its pipeline's lane (``fair``), queued -> running with a lease, attempts + 1.
        None if no queued job holds the token (a superseded or used-up message) or
        nothing in the lane is ready."""
        now = utcnow()
        params = {"token": token, "p_worker": worker_id, "now": now,
                  "lease": now + timedelta(seconds=lease_s)}
        if self._dialect == "postgresql":
            return self._claim_in_one(params)
        with self._sessions() as s:
            holder = s.execute(fair.HOLDER, {"token": token}).first()
        if holder is None:
            return None
        pipeline, lane = holder.pipeline, fair.lane_of(holder.batch_id)
        params["p_pipeline"] = pipeline
        with self._sessions.begin() as s:
            params["p_vtime"] = vtime = fair.lock_lane(s, pipeline, lane)
            job = s.connection().execute(_fair_claim(lane), params).one_or_none()
            if job is None:
                return None
            if job.dispatch_token != token:  # its message now wakes the lane for the holder
                s.connection().execute(fair.HAND_OVER, {"token": token,
                                                        "claimed_token": job.dispatch_token})
            fair.charge(s, pipeline, lane, job.tenant_id, vtime)
            stage_job_event(s, job.id, "started", job)
            history.open_attempt(s, job.id, job.attempts, worker_id, now)
            return job_record(job, outputs=())

    def _claim_in_one(self, params: dict[str, Any]) -> JobRecord | None:
        """``claim_next`` on PostgreSQL: the lane's lock, then one statement
        (``hotpath.claim``) that claims and writes what a claim writes."""
        with self._engine.begin() as conn:
            lane = conn.execute(hotpath.lock_lane(), params).first()
            if lane is None:
                return None
            params.update(p_pipeline=lane.pipeline, p_vtime=lane.vtime,
                          p_event=new_event_id())
            job = conn.execute(hotpath.claim(lane.lane), params).one_or_none()
            return None if job is None else job_record(job, outputs=())

    def heartbeat(self, job_id: str, attempt: int, lease_s: float,
                  progress: int | None = None) -> bool:
        """Extend the lease; False means the job is no longer ours (cancelled, reaped)."""
        now = utcnow()
        params: dict[str, Any] = {"job_id": job_id, "attempt": attempt, "now": now,
                                  "lease": now + timedelta(seconds=lease_s)}
        if progress is not None:
            params["new_progress"] = max(0, min(99, progress))
        # One statement on its own (autocommit): one round trip, no BEGIN and COMMIT.
        with self._engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            return conn.execute(_HEARTBEAT[progress is not None], params).rowcount == 1
