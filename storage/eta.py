"""A queued job's place in the fair-share order and when it should start and end.

Pure arithmetic on a ``LanePicture``: the position replays the stride order the claim
follows (each waiting tenant's k-th next job is served at its key plus k strides), and
the estimates hand the jobs ahead out to the live workers at the pipeline's measured
pace. They assume nothing new arrives ahead (a new tenant, an interactive job before a
bulk one) and that every worker serving the pipeline serves only it: estimates, honest
about their inputs, never promises.
"""

from __future__ import annotations

import math
from datetime import timedelta

from .records import JobRecord, LanePicture, QueueStanding

EPS = 1e-9
NO_LIVE_WORKER = "no_live_worker"
NO_RECENT_THROUGHPUT = "no_recent_throughput"
WORKERS_UNKNOWN = "worker_registry_unavailable"
NOT_READY = "waiting_for_retry_backoff"


def position(lane: LanePicture, job: JobRecord, rank: int) -> int:
    """Jobs of the lane that the claim will take before ``job``, the ``rank``-th ready
    job of its tenant."""
    me = job.tenant_id
    key = _key(lane, me) + rank / lane.weights.get(me, 1.0)
    mine_oldest = lane.oldest.get(me, job.created_at)
    ahead = rank
    for tenant, count in lane.waiting.items():
        if tenant == me:
            continue
        span = (key - _key(lane, tenant)) * lane.weights.get(tenant, 1.0)
        if lane.oldest[tenant] < mine_oldest:  # ties go to the tenant with the older job
            ahead += min(count, max(0, math.floor(span + EPS) + 1)) if span > -EPS else 0
        else:
            ahead += min(count, max(0, math.ceil(span - EPS)))
    return ahead


def standing(lane: LanePicture, job: JobRecord, rank: int, workers: int | None
             ) -> QueueStanding:
    """Position and estimates; ``workers``: live workers serving the pipeline (None: the
    registry could not be read)."""
    if job.ready_at is not None and job.ready_at > lane.at:
        return QueueStanding(position=position(lane, job, rank), reason=NOT_READY)
    place = position(lane, job, rank)
    reason = (WORKERS_UNKNOWN if workers is None else NO_LIVE_WORKER if workers == 0
              else NO_RECENT_THROUGHPUT if lane.interval_s is None else None)
    if reason is not None:
        return QueueStanding(position=place, reason=reason)
    step = lane.interval_s
    # Each worker is free when its running job (the newest claims) is due, or now.
    frees = sorted([max(lane.at, c + timedelta(seconds=step))
                    for c in lane.running[-workers:]]
                   + [lane.at] * max(0, workers - len(lane.running)))
    ahead = place + lane.before
    start = frees[ahead % workers] + timedelta(seconds=step * (ahead // workers))
    return QueueStanding(position=place, start_at=start,
                         completed_at=start + timedelta(seconds=lane.duration_s or step))


def _key(lane: LanePicture, tenant: str) -> float:
    return max(lane.passes.get(tenant, 0.0), lane.vtime)
