"""An API process's live hub (``Live``): its bus and its one watcher, the resync of
every job watched, and each tenant's open streams and waits (``Slot``).

Apart from api/live.py, which uses it, so that ``Services`` (api/deps.py) can hold a
``Live`` without the two importing each other: the hub knows nothing of the routes'
services, the waits and streams that take the services know the hub.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from fastapi.concurrency import run_in_threadpool

from core.errors import TooManyRequests
from storage.bus import UNREAD, Bus, Watcher
from storage.records import JobRecord

log = logging.getLogger(__name__)


def state_of(job: JobRecord | None) -> tuple[str, int, int] | None:
    """What the resync compares (``JobRepository.states``'s shape)."""
    return None if job is None else (job.status.value, job.attempts, job.progress)


class Slot:
    """One of a tenant's open streams and waits, taken when made and given back once:
    by ``release``, at the end of a ``with`` block, or when dropped unused (a stream
    whose body never started)."""

    def __init__(self, counts: dict[str, int], tenant_id: str) -> None:
        self._counts, self._tenant = counts, tenant_id
        counts[tenant_id] = counts.get(tenant_id, 0) + 1
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            left = self._counts[self._tenant] - 1
            if left:
                self._counts[self._tenant] = left
            else:
                del self._counts[self._tenant]

    def __enter__(self) -> Slot:
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    __del__ = release


@dataclass
class Live:
    """An API process's bus and its one watcher (built by the app factory), the resync
    of every job watched, and each tenant's open streams and waits."""

    bus: Bus
    watcher: Watcher
    states: Callable[[list[str]], dict[str, tuple]] = lambda ids: {}  # JobRepository's
    resync_s: float = 2.0
    max_streams: int = 100
    _open: dict[str, int] = field(default_factory=dict)
    _resync: asyncio.Task | None = None

    def notify(self, job_id: str) -> None:
        """From a route that changed a job (a cancel): best effort, like the worker's."""
        try:
            self.bus.notify(job_id)
        except Exception:
            log.warning("live notice for %s not sent", job_id, exc_info=True)

    def slot(self, tenant_id: str) -> Slot:
        """Take one of the tenant's streams and waits, or refuse with a 429."""
        if self._open.get(tenant_id, 0) >= self.max_streams:
            raise TooManyRequests(
                f"this tenant already has {self.max_streams} event streams, streamed "
                "responses and waits open on this server; close one or retry shortly",
                code="too_many_streams", retry_after_s=max(1, math.ceil(self.resync_s)))
        return Slot(self._open, tenant_id)

    def ensure_resync(self) -> None:
        loop = asyncio.get_running_loop()
        if self._resync is None or self._resync.done() or self._resync.get_loop() is not loop:
            self._resync = loop.create_task(self.resync())

    async def resync(self) -> None:
        """Every ``resync_s``: one query for the state of every job watched in this
        process; a watcher whose job is not as it last read it is woken (and re-reads)."""
        while True:
            await asyncio.sleep(self.resync_s)
            watched = self.watcher.subscriptions()
            if not watched:
                continue
            try:
                states = await run_in_threadpool(self.states, list(watched))
            except Exception:  # the database is away: try again next interval
                log.warning("live resync failed", exc_info=True)
                continue
            for job_id, subs in watched.items():
                for sub in subs:  # one still to make its first read will read anyway
                    if sub.seen is not UNREAD and sub.seen != states.get(job_id):
                        sub.changed = True
                        sub.event.set()
