"""What the broker still holds: the render messages waiting in a queue.

The stale-queued sweep asks this before re-sending a job's message, so a job that is
merely far back in a long queue is left alone and only a message that is really gone
(a broker restarted without its data, a message held by a worker that died) is sent
again. Messages a worker has taken are not counted: a queued job whose message was
taken long ago and never claimed has lost it.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path

from celery import Celery

from .dispatch import RENDER_TASK

log = logging.getLogger(__name__)

Dispatch = tuple[str, str | None]  # (job id, dispatch token)
PAGE = 1000


def waiting_dispatches(app: Celery, queues: Iterable[str]) -> set[Dispatch] | None:
    """The (job id, token) of every render message waiting in ``queues``, or None when
    the transport cannot be inspected (then every stale job counts as lost)."""
    queues = list(queues)
    with app.connection_for_read() as conn:
        channel = conn.default_channel
        driver = conn.transport.driver_type
        if driver == "redis":
            raws: Iterable[bytes | str] = _redis_messages(channel, queues)
        elif driver == "filesystem":
            raws = _folder_messages(Path(channel.data_folder_in), queues)
        else:
            return None
        return {d for raw in raws if (d := _dispatch(raw)) is not None}


def _redis_messages(channel, queues: list[str]) -> Iterator[bytes]:
    client = channel.client
    for queue in queues:
        keys = [queue] + [f"{queue}{channel.sep}{p}" for p in channel.priority_steps if p]
        for key in keys:
            start = 0
            while page := client.lrange(key, start, start + PAGE - 1):
                yield from page
                start += PAGE


def _folder_messages(folder: Path, queues: list[str]) -> Iterator[bytes]:
    suffixes = tuple(f".{q}.msg" for q in queues)
    for path in folder.iterdir():
        if path.name.endswith(suffixes):
            try:
                yield path.read_bytes()
            except OSError:  # taken by a worker meanwhile
                continue


def _dispatch(raw: bytes | str) -> Dispatch | None:
    """(job id, token) of a Celery protocol-2 render message; None for anything else."""
    try:
        payload = json.loads(raw)
        if payload.get("headers", {}).get("task") != RENDER_TASK:
            return None
        body = payload["body"]
        if payload.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        return str(args[0]), (str(args[1]) if len(args) > 1 and args[1] else None)
    except (ValueError, KeyError, IndexError, TypeError):
        log.debug("unreadable message in a render queue", exc_info=True)
        return None
