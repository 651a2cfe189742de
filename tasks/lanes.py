"""Render lanes: interactive jobs first, a batch's jobs (the bulk lane) after them.

Both lanes share their pipeline's queue; a bulk message carries the lowest priority.
With Redis, kombu keeps one list per priority step (``queue``, ``queue\\x06\\x169``, ...)
and a worker's BRPOP names every step of every queue it serves, highest priority first:
Redis pops from the first non-empty list, so with prefetch 1 and late acks a free
worker takes an interactive job before any bulk one, whichever of its queues holds it.
(The order *between queues* round-robins, but only within one priority step.)

The embedded filesystem broker has no priorities; ``FilesystemTransport`` adds them:
the lane leads the message's file name, and a consumer takes the first name across all
the queues it serves, so the same rule holds there.

Bulk publishing sends a batch's messages through kombu's producer batches (Redis
pipelines, one round trip per few thousand messages) instead of one ``send_task`` each.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Sequence
from queue import Empty
from time import monotonic_ns

from celery import Celery
from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

from core.errors import ServiceUnavailable

from .dispatch import BULK_PRIORITY, RENDER_TASK

log = logging.getLogger(__name__)

PUBLISH_CHUNK = 2000


def publish_bulk(app: Celery, queued: Sequence[tuple[str, str, str]]) -> None:
    """Send a render message per ``(job id, queue, dispatch token)`` in the bulk lane, a
    chunk per round trip. Raises ServiceUnavailable if the broker fails: the outbox still
    holds them all for the relay (a message sent twice is harmless: its second claim finds
    the job taken)."""
    template = render_template(app)
    with app.producer_or_acquire() as producer:
        for start in range(0, len(queued), PUBLISH_CHUNK):
            try:
                with producer.batch(max_size=PUBLISH_CHUNK):
                    for job_id, queue, token in queued[start:start + PUBLISH_CHUNK]:
                        publish_raw(producer, template, [job_id, token], queue)
            except Exception as exc:  # kombu/redis errors
                raise ServiceUnavailable(f"broker unavailable: {type(exc).__name__}") from exc


def render_template(app: Celery):
    """Celery's own render message, built once, for ``publish_raw`` to fill in."""
    return app.amqp.as_task_v2("", RENDER_TASK, args=["", ""], kwargsrepr="{}",
                               ignore_result=True)


def publish_raw(producer, template, args: list[str], queue: str,
             priority: int = BULK_PRIORITY) -> None:
    """The render message ``send_task`` would send (Celery's own, built once, with this
    job's id and dispatch token and a task id of its own), without the per-message
    signals and sent-events that would cost more than the publish itself at this scale."""
    task_id = str(uuid.uuid4())
    _, kwargs, embed = template.body
    headers = {**template.headers, "id": task_id, "root_id": task_id, "argsrepr": repr(args)}
    producer.publish((args, kwargs, embed), exchange="", routing_key=queue,
                     headers=headers, priority=priority, serializer="json", retry=False,
                     **{**template.properties, "correlation_id": task_id})


# ---- the embedded broker, with lanes -------------------------------------------------

def _lane_prefix(priority: int) -> str:
    return f"p{BULK_PRIORITY if priority >= BULK_PRIORITY else 0}-"


class _FirstMessageFirst:
    """A consumer's queue cycle that serves the queue holding the first message by name
    (lane, then age) instead of taking the queues in turn."""

    def __init__(self, channel: LaneChannel) -> None:
        self.channel = channel

    def get(self, callback, **_kwargs):
        channel = self.channel
        active = set(channel._active_queues)
        for name in sorted(os.listdir(channel.data_folder_in)):
            queue = name.partition(".")[2].removesuffix(".msg")
            if queue in active:
                try:
                    return channel._get_and_deliver(queue, callback)
                except Empty:  # another consumer took it meanwhile
                    continue
        raise Empty()

    def close(self) -> None:
        pass


class LaneChannel(filesystem.Channel):
    def _put(self, queue, payload, **kwargs):
        """As kombu's, with the message's lane leading its file name, and written under
        a temporary name first: a consumer never reads a file still being written."""
        lane = _lane_prefix(self._get_message_priority(payload))
        name = f"{lane}{monotonic_ns():020d}_{uuid.uuid4()}.{queue}.msg"  # then oldest first
        path = os.path.join(self.data_folder_out, name)
        try:
            with open(path + ".part", "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            os.replace(path + ".part", path)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {name!r} to directory") from exc

    def _reset_cycle(self):
        self._cycle = _FirstMessageFirst(self)


class FilesystemTransport(filesystem.Transport):
    """kombu's filesystem transport with lanes (``broker_transport`` in embedded mode)."""

    Channel = LaneChannel
