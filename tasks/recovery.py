"""Nothing lost: publish what the outbox still holds, reclaim expired leases, re-send the
render message of a queued job whose message is really gone, prune the published outbox;
and nothing kept past its time: queued jobs whose start deadline passed end ``expired``.

Run by the maintenance process (tasks/maintenance.py), never by a render worker.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from celery import Celery

from core.errors import ServiceUnavailable
from pipelines import queue_for
from storage.records import JobRecord

from .broker import waiting_dispatches
from .dispatch import publish_and_mark
from .live import notify
from .publish import publish_many
from .runtime import WorkerRuntime

log = logging.getLogger(__name__)


RELAY_PAGE = 2000  # messages per read, per broker round trip and per update
RELAY_BUDGET_S = 3.0  # per run, below the relay's 5 s period: the other steps wait on it


def relay_outbox(rt: WorkerRuntime, app: Celery, budget_s: float = RELAY_BUDGET_S,
                 page: int = RELAY_PAGE) -> int:
    """Publish what the outbox holds due, page after page until nothing is due or the
    time budget is spent: after a broker outage a 50,000-job batch is re-sent in seconds,
    not at one page per period. Interactive messages go first (one read of those each
    run, then every due message by age), so a batch's backlog never holds them up. A
    page goes out in one broker round trip (``publish_many``); a broker failure ends the
    run and leaves the rest for the next one."""
    deadline = time.monotonic() + budget_s
    relayed, interactive_only = 0, True
    while True:
        msgs = rt.outbox.due(grace_s=rt.settings.outbox_grace_s, limit=page,
                             interactive_only=interactive_only)
        if msgs:
            try:
                publish_many(app, msgs)
            except ServiceUnavailable:
                log.warning("outbox relay: broker unavailable; %d left for the next run",
                            len(msgs))
                return relayed
            rt.outbox.mark_published([m.id for m in msgs])
            relayed += len(msgs)
        if len(msgs) < page:
            if not interactive_only:
                return relayed
            interactive_only = False
        if time.monotonic() >= deadline:
            return relayed


def lost_render(rt: WorkerRuntime, job: JobRecord) -> tuple[float, None] | None:
    """A lost attempt's time, as far as anyone saw it: from its claim to its worker's last
    heartbeat (the lease's expiry less one lease). A worker killed outright reports
    nothing, and that time was spent (on the device too) all the same."""
    if job.lease_expires_at is None:
        return None
    claimed = next((a.claimed_at for a in rt.jobs.attempts(job.id)
                    if a.attempt == job.attempts), None)
    if claimed is None:
        return None
    last_beat = job.lease_expires_at - timedelta(seconds=rt.settings.lease_s)
    return max(0.0, (last_beat - claimed).total_seconds()), None


def reclaim(rt: WorkerRuntime, app: Celery, job: JobRecord) -> bool:
    """Each job reclaimed is a line of its own, naming it (the step's count alone says
    that something happened, not to which job). The lost attempt's time goes on its
    record (``lost_render``)."""
    where = f"job {job.id} ({job.pipeline}): its worker stopped responding on attempt " \
            f"{job.attempts} of {job.max_attempts}"
    render = lost_render(rt, job)
    if job.attempts >= job.max_attempts:
        failed = rt.jobs.fail(job.id, "lease_expired",
                              f"worker stopped responding on attempt {job.attempts} of "
                              f"{job.max_attempts}", attempt=job.attempts, only_if_expired=True,
                              render=render)
        if failed:
            log.warning("%s; failed (no attempt left)", where, extra={"job_id": job.id})
        return failed
    msg = rt.jobs.requeue(job.id, job.attempts, queue=queue_for(job.pipeline), delay_s=0,
                          code="lease_expired", message="worker stopped responding; retrying",
                          only_if_expired=True, render=render)
    publish_and_mark(app, rt.outbox, msg)
    if msg is not None:
        log.warning("%s; queued again", where, extra={"job_id": job.id})
    return msg is not None


def expire_overdue(rt: WorkerRuntime, _app: Celery) -> int:
    """Queued jobs past their start deadline end ``expired`` without running (a render
    message that still arrives finds them claimed by nobody). A pass takes a bounded
    number; the next one takes the rest."""
    expired = rt.jobs.expire_queued()
    for job_id in expired:
        notify(rt.bus, job_id)
    return len(expired)


def reap_leases(rt: WorkerRuntime, app: Celery) -> int:
    """Running jobs whose worker stopped heartbeating go back to the queue (or fail)."""
    reaped = 0
    for job in rt.jobs.expired_leases():
        try:
            reaped += int(reclaim(rt, app, job))
        except Exception:  # one bad row must not stall the others
            log.exception("could not reclaim job %s", job.id, extra={"job_id": job.id})
    return reaped


def sweep_stale_queued(rt: WorkerRuntime, app: Celery) -> int:
    """Re-send the message of each job queued for ``STALE_QUEUED_S`` whose message the
    broker no longer holds. One still waiting in its queue is a long queue, not a loss."""
    stale = rt.jobs.stale_queued(rt.settings.stale_queued_s)
    if not stale:
        return 0
    try:
        waiting = waiting_dispatches(app, {queue_for(j.pipeline) for j in stale})
    except Exception:  # broker down: nothing could be re-sent now anyway
        log.warning("stale-queued sweep: broker unreachable; next round", exc_info=True)
        return 0
    # A message wakes whichever queued job holds its token, so the token is what counts.
    tokens = None if waiting is None else {token for _, token in waiting}
    swept = 0
    for job in stale:
        if tokens is not None and job.dispatch_token in tokens:
            continue
        try:
            swept += int(_resend(rt, app, job))
        except Exception:  # one bad row must not stall the others
            log.exception("could not re-send job %s", job.id, extra={"job_id": job.id})
    return swept


def _resend(rt: WorkerRuntime, app: Celery, job: JobRecord) -> bool:
    msg = rt.jobs.republish(job, queue_for(job.pipeline))
    if msg is None:
        return False
    log.warning("job %s queued since %s and its message is gone: re-sent", job.id,
                job.updated_at.isoformat(), extra={"job_id": job.id})
    publish_and_mark(app, rt.outbox, msg)
    return True


def prune_outbox(rt: WorkerRuntime, _app: Celery) -> int:
    return rt.outbox.prune(rt.settings.outbox_retention_s)
