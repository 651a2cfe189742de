"""Periodic upkeep: publish what the outbox still holds, reclaim expired leases."""

from __future__ import annotations

import logging

from celery import Celery

from ..core.errors import ServiceUnavailable
from ..pipelines import get_spec
from .dispatch import publish
from .runtime import WorkerRuntime, get_runtime

log = logging.getLogger(__name__)

MAINTENANCE_QUEUE = "maintenance"


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


def reap_leases(rt: WorkerRuntime, app: Celery) -> int:
    """Running jobs whose worker stopped heartbeating go back to the queue (or fail)."""
    reaped = 0
    for job in rt.jobs.expired_leases():
        if job.attempts >= job.max_attempts:
            ok = rt.jobs.fail(job.id, "lease_expired",
                              f"worker stopped responding on attempt {job.attempts} of "
                              f"{job.max_attempts}", attempt=job.attempts)
        else:
            msg = rt.jobs.requeue(job.id, job.attempts, queue=get_spec(job.pipeline).queue,
                                  delay_s=0, code="lease_expired",
                                  message="worker stopped responding; retrying")
            ok = msg is not None
            if msg is not None:
                try:
                    publish(app, msg)
                    rt.outbox.mark_published([msg.id])
                except ServiceUnavailable:
                    log.warning("broker down; reclaimed job %s waits in the outbox", job.id)
        reaped += int(ok)
    return reaped


def register(app: Celery) -> None:
    @app.task(name="omnijobs.relay_outbox", ignore_result=True)
    def relay() -> int:
        return relay_outbox(get_runtime(), app)

    @app.task(name="omnijobs.reap_leases", ignore_result=True)
    def reap() -> int:
        return reap_leases(get_runtime(), app)
