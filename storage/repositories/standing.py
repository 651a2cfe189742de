"""Where a queued job stands: what its lane holds and how fast the pipeline has been
going, read from the jobs table, the fair-share tables and the attempts.

A lane's picture (``lane``) is the same for every job waiting in it, so readers keep it
for a moment and pay per job only for ``rank`` (one index range count). The pace comes
from the pipeline's recent attempts: how long one took from claim to completion, and how
long a busy worker took between one claim and its next (less, when finalize overlaps
the next generation).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session, sessionmaker

from core.batches import BULK_LANE

from ..models import Job, JobAttempt, LaneClock, Tenant, TenantService
from ..records import JobRecord, LanePicture
from .fair import INTERACTIVE, lane_of, waiting

PACE_WINDOW_S = 3600.0  # attempts older than this say nothing about the pace now
PACE_ATTEMPTS = 200


class StandingRepository:
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    def lane(self, pipeline: str, lane: str) -> LanePicture:
        now = datetime.now(UTC)
        params = {"p_pipeline": pipeline, "now": now}
        with self._sessions() as s:
            tenants = s.execute(select(Job.tenant_id, func.count(), func.min(Job.created_at))
                                .where(waiting(Job, lane)).group_by(Job.tenant_id),
                                params).all()
            ids = [t for t, _, _ in tenants]
            standing = {r.id: (r.share_weight, r.pass_) for r in s.execute(
                select(Tenant.id, Tenant.share_weight, TenantService.pass_).outerjoin(
                    TenantService, and_(TenantService.tenant_id == Tenant.id,
                                        TenantService.pipeline == pipeline,
                                        TenantService.lane == lane))
                .where(Tenant.id.in_(ids)))} if ids else {}
            vtime = s.scalar(select(LaneClock.vtime).where(
                LaneClock.pipeline == pipeline, LaneClock.lane == lane)) or 0.0
            before = 0
            if lane == BULK_LANE:  # the interactive lane goes first
                before = s.scalar(select(func.count()).select_from(Job).where(
                    waiting(Job, INTERACTIVE)), params) or 0
            running = [c for (c,) in s.execute(
                select(JobAttempt.claimed_at).join(Job, and_(
                    Job.id == JobAttempt.job_id, Job.attempts == JobAttempt.attempt))
                .where(Job.pipeline == pipeline, Job.status == "running",
                       JobAttempt.ended_at.is_(None)))]
            attempts = s.execute(
                select(JobAttempt.worker_id, JobAttempt.claimed_at, JobAttempt.ended_at,
                       JobAttempt.outcome).join(Job, Job.id == JobAttempt.job_id)
                .where(Job.pipeline == pipeline,
                       JobAttempt.claimed_at >= now - timedelta(seconds=PACE_WINDOW_S))
                .order_by(JobAttempt.claimed_at.desc()).limit(PACE_ATTEMPTS)).all()
        duration, interval = pace(attempts)
        return LanePicture(
            pipeline=pipeline, lane=lane, at=now, vtime=vtime, before=before,
            waiting={t: n for t, n, _ in tenants}, oldest={t: o for t, _, o in tenants},
            weights={t: standing.get(t, (1.0, None))[0] for t in ids},
            passes={t: p for t, (_, p) in standing.items() if p is not None},
            running=tuple(sorted(running)), duration_s=duration, interval_s=interval)

    def ranks(self, pipeline: str, lane: str, jobs: Sequence[JobRecord]) -> dict[str, int]:
        """``rank`` of every one of ``jobs`` (queued in ``pipeline``'s ``lane``) that is
        ready, in one query: their tenants' ready jobs in the lane, numbered per tenant
        in the claim's order. What an API process's queued streams share (api/standing.py)
        instead of a count each."""
        if not jobs:
            return {}
        numbered = select(Job.id, (func.row_number().over(
            partition_by=Job.tenant_id, order_by=(Job.created_at, Job.id)) - 1).label("rank")
        ).where(waiting(Job, lane), Job.tenant_id.in_(sorted({j.tenant_id for j in jobs}))
                ).subquery()
        with self._sessions() as s:
            rows = s.execute(select(numbered.c.id, numbered.c.rank).where(
                numbered.c.id.in_([j.id for j in jobs])),
                {"p_pipeline": pipeline, "now": datetime.now(UTC)})
            return {job_id: rank for job_id, rank in rows}

    def rank(self, job: JobRecord) -> int:
        """The tenant's own ready jobs in the lane that were queued before ``job``."""
        lane = lane_of(job.batch_id)
        with self._sessions() as s:
            return s.scalar(select(func.count()).select_from(Job).where(
                waiting(Job, lane), Job.tenant_id == job.tenant_id,
                or_(Job.created_at < job.created_at,
                    and_(Job.created_at == job.created_at, Job.id < job.id))),
                {"p_pipeline": job.pipeline, "now": datetime.now(UTC)}) or 0


def pace(attempts) -> tuple[float | None, float | None]:
    """(claim to completion, a busy worker's claim to its next claim), medians in
    seconds, from recent attempts (newest first); None where nothing was measured. A
    gap much longer than a job is a worker that sat idle, not one that was slow."""
    done = [(a.ended_at - a.claimed_at).total_seconds() for a in attempts
            if a.outcome == "completed" and a.ended_at is not None]
    if not done:
        return None, None
    duration = statistics.median(done)
    by_worker: dict[str, list[datetime]] = defaultdict(list)
    for a in attempts:
        if a.worker_id:
            by_worker[a.worker_id].append(a.claimed_at)
    gaps = [(later - earlier).total_seconds() for claims in by_worker.values()
            for later, earlier in zip(claims, claims[1:], strict=False)]
    busy = [g for g in gaps if 0 < g <= 1.5 * duration + 0.5]
    return duration, statistics.median(busy) if len(busy) >= 3 else duration
