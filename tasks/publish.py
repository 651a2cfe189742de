"""Publishing a group of render messages in one broker round trip.

The API's group commit (api/submitter.py) hands over every message its group committed
at once: each is the message ``send_task`` would send, built from one template, and the
lot goes through one kombu producer batch (one Redis pipeline) with no per-message
signals or ``task-sent`` events. A message that is not due yet keeps ``send_task`` and
its countdown.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from celery import Celery

from core.batches import BULK_LANE
from core.errors import ServiceUnavailable
from storage.records import OutboxRecord

from .dispatch import BULK_PRIORITY, publish
from .lanes import PUBLISH_CHUNK, publish_raw, render_template


def publish_many(app: Celery, msgs: Sequence[OutboxRecord]) -> None:
    """Send every message; ServiceUnavailable if the broker fails (the outbox keeps them
    for the relay; a message sent twice is harmless)."""
    now = datetime.now(UTC)
    due = [m for m in msgs if m.available_at <= now]
    for msg in msgs:
        if msg.available_at > now:
            publish(app, msg)
    if not due:
        return
    template = render_template(app)
    try:
        with app.producer_or_acquire() as producer:
            for start in range(0, len(due), PUBLISH_CHUNK):
                with producer.batch(max_size=PUBLISH_CHUNK):
                    for msg in due[start:start + PUBLISH_CHUNK]:
                        priority = BULK_PRIORITY if msg.payload.get("lane") == BULK_LANE else 0
                        publish_raw(producer, template, [msg.job_id, msg.token], msg.queue,
                                    priority)
    except Exception as exc:  # kombu/redis errors
        raise ServiceUnavailable(f"broker unavailable: {type(exc).__name__}") from exc
