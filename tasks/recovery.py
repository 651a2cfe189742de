"""Nothing lost: publish what the outbox still holds, reclaim expired leases, re-send the
render message of a queued job whose message is really gone, prune the published outbox.

Run by the maintenance process (tasks/maintenance.py), never by a render worker.
"""

from __future__ import annotations

import logging

from celery import Celery

from core.errors import ServiceUnavailable
from pipelines import queue_for
from storage.records import JobRecord

from .broker import waiting_dispatches
from .dispatch import publish, publish_and_mark
from .runtime import WorkerRuntime

log = logging.getLogger(__name__)


def relay_outbox(rt: WorkerRuntime, app: Celery) -> int:
    published = []
    for msg in rt.outbox.due(grace_s=rt.settings.outbox_grace_s):
        try:
            publish(app, msg)
        except ServiceUnavailable:
            break
        published.append(msg.id)
    rt.outbox.mark_published(published)
    return len(published)


def reclaim(rt: WorkerRuntime, app: Celery, job: JobRecord) -> bool:
    if job.attempts >= job.max_attempts:
        return rt.jobs.fail(job.id, "lease_expired",
                            f"worker stopped responding on attempt {job.attempts} of "
                            f"{job.max_attempts}", attempt=job.attempts, only_if_expired=True)
    msg = rt.jobs.requeue(job.id, job.attempts, queue=queue_for(job.pipeline), delay_s=0,
                          code="lease_expired", message="worker stopped responding; retrying",
                          only_if_expired=True)
    publish_and_mark(app, rt.outbox, msg)
    return msg is not None


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
