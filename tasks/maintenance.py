"""Periodic upkeep: publish what the outbox still holds, reclaim expired leases, and
re-announce queued jobs whose message was lost (a broker that dropped it, a render
task that failed before it could claim)."""

from __future__ import annotations

import logging

from celery import Celery

from core.errors import ServiceUnavailable
from pipelines import queue_for
from storage.records import JobRecord

from .dispatch import MAINTENANCE_QUEUE, publish, publish_and_mark
from .runtime import WorkerRuntime, get_runtime

log = logging.getLogger(__name__)

__all__ = ["MAINTENANCE_QUEUE", "reap_leases", "register", "relay_outbox",
           "sweep_stale_queued"]


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
    swept = 0
    for job in rt.jobs.stale_queued(rt.settings.stale_queued_s):
        try:
            msg = rt.jobs.republish(job, queue_for(job.pipeline))
            if msg is not None:
                log.warning("job %s queued since %s: message re-sent", job.id,
                            job.updated_at.isoformat(), extra={"job_id": job.id})
                publish_and_mark(app, rt.outbox, msg)
                swept += 1
        except Exception:  # one bad row must not stall the others
            log.exception("could not re-send job %s", job.id, extra={"job_id": job.id})
    return swept


def register(app: Celery) -> None:
    @app.task(name="omnijobs.relay_outbox", shared=False, ignore_result=True)
    def relay() -> int:
        return relay_outbox(get_runtime(), app)

    @app.task(name="omnijobs.reap_leases", shared=False, ignore_result=True)
    def reap() -> int:
        return reap_leases(get_runtime(), app)

    @app.task(name="omnijobs.sweep_queued", shared=False, ignore_result=True)
    def sweep() -> int:
        return sweep_stale_queued(get_runtime(), app)
