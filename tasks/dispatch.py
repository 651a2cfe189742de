"""Publishing render messages to the broker, for the API and the relay alike."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from celery import Celery

from core.batches import BULK_LANE
from core.errors import ServiceUnavailable
from storage.records import OutboxRecord
from storage.repositories import OutboxRepository

log = logging.getLogger(__name__)

RENDER_TASK = "omnijobs.render"
MAINTENANCE_QUEUE = "maintenance"
WEBHOOK_QUEUE = "webhooks"
# The Celery queues the maintenance process consumes; render workers never do, so no
# render backlog can hold this work up.
MAINTENANCE_QUEUES = (MAINTENANCE_QUEUE, WEBHOOK_QUEUE)
BULK_PRIORITY = 9  # a batch's jobs: kombu's Redis transport serves 0 first and 9 last


def publish(app: Celery, msg: OutboxRecord) -> None:
    """Send the render message with the job's dispatch token (see ``JobRepository.claim``)."""
    countdown = max(0.0, (msg.available_at - datetime.now(UTC)).total_seconds())
    try:
        app.send_task(RENDER_TASK, args=[msg.job_id, msg.token], queue=msg.queue,
                      countdown=countdown or None, retry=False,
                      priority=BULK_PRIORITY if msg.payload.get("lane") == BULK_LANE else None)
    except Exception as exc:  # kombu/redis errors: the outbox keeps the message
        raise ServiceUnavailable(f"broker unavailable: {type(exc).__name__}") from exc


def publish_and_mark(app: Celery, outbox: OutboxRepository, msg: OutboxRecord | None) -> bool:
    """Publish now if the broker answers; otherwise leave it for the relay."""
    if msg is None:
        return False
    try:
        publish(app, msg)
    except ServiceUnavailable:
        log.warning("broker down; job %s stays in the outbox for the relay", msg.job_id)
        return False
    outbox.mark_published([msg.id])
    return True
