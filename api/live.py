"""Watching jobs live: the pushed synchronous wait and the job event stream (SSE).

Both wait on notices (storage/bus/) and re-read the job from the database when one
arrives and when they start; the database is the source of truth and a notice carries
nothing else. In case a notice was lost, the process checks every job it watches every
``OMNIJOBS_EVENT_RESYNC_S``, in one query for all of them (``Live.resync``: the process's
hub is api/live_hub.py), and wakes the watchers whose job changed: a thousand idle streams
cost one query per interval, not a thousand. While it waits, a request is an
``asyncio.Event``: no thread, no connection.

A tenant holds at most ``OMNIJOBS_TENANT_MAX_STREAMS`` streams and waits open at once
on an API process (``Live.slot``); one more is a 429, before anything is submitted.

Event ids are derived from the job's state, never from a counter in memory, so any API
process can resume any stream from ``Last-Event-ID``: they grow with every change a
client can see (queued, each attempt's progress, the end).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel

from core.errors import InvalidRequest
from core.jobs import JobStatus
from storage.bus import Bus, Result, Subscription
from storage.records import JobRecord
from storage.views import queue_fields

from .deps import Services
from .live_hub import Slot, state_of
from .metrics import LIVE_ACTIVE

log = logging.getLogger(__name__)

TERMINAL_ID = 1_000_000_000  # the terminal status; a completed job's output follows it
HANDOFF_ASK_S = 0.5  # how long a synchronous submit waits for its hand-over to be arranged
QUEUE_EVENT_S = 2.0  # how often a queued job's place is read again for ``queue`` events
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def watch_bus(bus: Bus, job_id: str) -> None:
    """``bus.watch``, in a worker thread only where it does something (the spool)."""
    if bus.watches:
        await run_in_threadpool(bus.watch, job_id)


class Watch:
    """One request watching one job: reloads when woken (a notice, the resync)."""

    def __init__(self, svc: Services, job: JobRecord, sub: Subscription) -> None:
        self.svc, self.job, self.sub = svc, job, sub
        sub.seen = state_of(job)
        svc.live.ensure_resync()

    async def reload(self) -> JobRecord:
        """The job as the database has it now (unchanged if the read fails: retried at
        the next notice or resync; gone, as a deleted job, is left to the caller)."""
        try:
            job = await run_in_threadpool(self.svc.jobs.get, self.job.id, self.job.tenant_id)
        except Exception:
            log.warning("re-reading job %s failed", self.job.id, exc_info=True,
                        extra={"job_id": self.job.id})
            return self.job
        self.sub.seen, self.sub.changed = state_of(job), False
        if job is not None:
            self.job = job
        return self.job

    async def next(self, remaining_s: float) -> bool:
        """Wait for a notice or a change the resync saw (True), or the deadline (False)."""
        return await self.sub.wait(remaining_s)


@contextlib.asynccontextmanager
async def watching(svc: Services, job_id: str, timeout_s: float
                   ) -> AsyncIterator[Callable[[JobRecord], Awaitable[JobRecord | Result]]]:
    """A synchronous wait on a job that does not exist yet (its id chosen by the route):
    subscribed, and the result's hand-over arranged, before the job is committed, so no
    notice of it can come too early to be heard and a worker that finishes at once still
    finds the process that expects its result. The ask waits at most HANDOFF_ASK_S (a
    frozen broker must not hold every synchronous submit) and then goes on in the
    background; without it the wait reads the record and the store at the end. Yields
    ``until_done(job)``: the job once it ends or the timeout passes, pushed by notices (no
    poll loop), or its result when the worker handed it over with the completion
    (storage/bus/): the bytes it stored for the job it recorded completed, so nothing
    is read. A job that turns out to be another one (an idempotent replay) is waited on
    as ``wait_for`` does."""
    live = svc.live
    deadline = time.monotonic() + timeout_s
    with live.watcher.subscribe(job_id) as sub, LIVE_ACTIVE.labels("wait").track_inprogress():
        asked = asyncio.ensure_future(run_in_threadpool(live.bus.expect_result, job_id,
                                                        timeout_s))
        asked.add_done_callback(_handoff_asked)
        await asyncio.wait({asked}, timeout=HANDOFF_ASK_S)

        async def until_done(job: JobRecord) -> JobRecord | Result:
            if job.id != job_id:
                return await wait_for(svc, job, deadline - time.monotonic())
            return await _until_done(Watch(svc, job, sub), deadline)
        yield until_done


def _handoff_asked(task: asyncio.Task) -> None:
    """Without the handed result the wait reads the record and the store: log, go on."""
    if not task.cancelled() and task.exception() is not None:
        log.warning("waiting request: result handoff not arranged (%s)",
                    type(task.exception()).__name__)


async def wait_for(svc: Services, job: JobRecord, timeout_s: float) -> JobRecord | Result:
    """``watching``'s wait for a job that existed before the wait began: subscribed
    first, then read once (it may have changed before)."""
    live = svc.live
    deadline = time.monotonic() + timeout_s
    with live.watcher.subscribe(job.id) as sub, LIVE_ACTIVE.labels("wait").track_inprogress():
        await run_in_threadpool(live.bus.expect_result, job.id, timeout_s)
        watch = Watch(svc, job, sub)
        await watch.reload()
        return await _until_done(watch, deadline)


async def _until_done(watch: Watch, deadline: float) -> JobRecord | Result:
    job, sub = watch.job, watch.sub
    while not job.status.terminal and (left := deadline - time.monotonic()) > 0:
        if await watch.next(left):
            if sub.result is not None:  # sent only once the job is recorded completed
                return sub.result
            if sub.changed:  # not just claimed or progressing: it may have ended
                job = await watch.reload()
    return job


def event_id(job: JobRecord) -> int:
    """Queued before attempt n+1: (n+1)*1000; running attempt n at progress p: n*1000+1+p;
    ended: TERMINAL_ID. A retry's queued state sorts after the attempt it follows."""
    if job.status.terminal:
        return TERMINAL_ID
    if job.status is JobStatus.QUEUED:
        return (job.attempts + 1) * 1000
    return job.attempts * 1000 + 1 + min(job.progress, 998)


def parse_last_event_id(value: str | None) -> int:
    if value is None or not value.strip():
        return -1
    try:
        return int(value.strip())
    except ValueError:
        raise InvalidRequest("Last-Event-ID must be an event id this stream sent",
                             param="Last-Event-ID", code="invalid_last_event_id") from None


def sse(event: str, data: str, event_id: int | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {data}\n\n".encode()


def events_since(job: JobRecord, last: int, present: Callable[[JobRecord], BaseModel]
                 ) -> list[tuple[int, bytes]]:
    """The events a client that saw ``last`` has not seen, for the job as it is now."""
    now = event_id(job)
    out: list[tuple[int, bytes]] = []
    shown = functools.cache(lambda: present(job).model_dump_json())  # signed URLs once
    if now > last:
        same_attempt_running = (job.status is JobStatus.RUNNING and last % 1000 != 0
                                and last // 1000 == job.attempts)
        kind = "progress" if same_attempt_running else "status"
        out.append((now, sse(kind, shown(), now)))
    if job.status is JobStatus.COMPLETED and last < TERMINAL_ID + 1:
        out.append((TERMINAL_ID + 1, sse("output", shown(), TERMINAL_ID + 1)))
    return out


async def job_events(svc: Services, job: JobRecord, last: int,
                     present: Callable[[JobRecord], BaseModel], slot: Slot
                     ) -> AsyncIterator[bytes]:
    """``status`` / ``progress`` / ``output`` events until the job ends, heartbeats while
    idle, and at most ``OMNIJOBS_EVENT_STREAM_MAX_S`` in all (the client resumes)."""
    settings, live = svc.settings, svc.live
    deadline = time.monotonic() + settings.event_stream_max_s
    with slot, live.watcher.subscribe(job.id) as sub, \
            LIVE_ACTIVE.labels("events").track_inprogress():
        await watch_bus(live.bus, job.id)
        watch = Watch(svc, job, sub)
        job = await watch.reload()
        yield f"retry: {int(settings.event_resync_s * 1000)}\n\n".encode()
        quiet_since, shown, read_at = time.monotonic(), None, float("-inf")
        resumed = last >= event_id(job)
        while True:
            for sent, data in events_since(job, last, present):
                yield data
                last, quiet_since = sent, time.monotonic()
            if job.status is JobStatus.QUEUED and time.monotonic() - read_at >= QUEUE_EVENT_S:
                read_at = time.monotonic()
                if place := await queue_event(svc, job, shown):
                    shown, data = place
                    if not resumed:  # a resumed stream hears of changes only
                        yield data
                        quiet_since = time.monotonic()
                resumed = False
            if job.status.terminal or (left := deadline - time.monotonic()) <= 0:
                return
            wait = min(left, settings.event_heartbeat_s)
            woken = await watch.next(min(wait, QUEUE_EVENT_S)
                                     if job.status is JobStatus.QUEUED else wait)
            if time.monotonic() - quiet_since >= settings.event_heartbeat_s:
                yield b": keep-alive\n\n"
                quiet_since = time.monotonic()
            if woken:
                job = await watch.reload()


async def queue_event(svc: Services, job: JobRecord, shown: dict | None
                      ) -> tuple[dict, bytes] | None:
    """A ``queue`` event (no id: a place in the queue is no state to resume from) when
    the job's position changed or an estimate moved by more than a second or two since
    the last one shown; None otherwise, or when it cannot be read now."""
    if svc.standings is None:
        return None
    try:  # from what the process has read lately, or read now (in a thread)
        standing = svc.standings.known(job) or await run_in_threadpool(svc.standings.of, job)
    except Exception:
        log.warning("queue position of %s unreadable", job.id, exc_info=True,
                    extra={"job_id": job.id})
        return None
    fields = {"id": job.id, **queue_fields(standing)}
    if shown is not None and not _moved(shown, fields):
        return None
    return fields, sse("queue", json.dumps(fields))


def _moved(before: dict, now: dict) -> bool:
    for name, value in now.items():
        old = before.get(name)
        if name.startswith("estimated_") and value is not None and old is not None:
            if abs(value - old) > 2:
                return True
        elif value != old:
            return True
    return False


def error_json(code: str, message: str) -> str:
    return json.dumps({"type": "error", "error": {"type": "server_error", "code": code,
                                                  "message": message, "param": None}})
