"""Live notices and audio chunks, from workers (and API processes) to API processes.

A notice says "job X changed, read it again": it carries no state, so one that is lost
costs latency, never correctness (the database stays the source of truth, and an API
process re-checks every job it watches on a timer as well). Audio chunks carry the
samples a job adds as it is generated, raw float32, for the API to encode in whatever
format its client asked.
A worker sends chunks only while someone listens (``listen``), so jobs nobody streams
cost one existence check per chunk.

A synchronous wait may also ask for the result itself (``expect_result``): the worker
that completes the job then hands the encoded bytes of a small output (``HANDOFF_MAX_BYTES``)
to the waiting process with the completion, after the output is stored and the job
recorded, so the answer needs neither a database read nor a store GET. The handed result
is a copy of what was stored; a wait that gets none (a lost message, a large output, no
one asked) reads the record and the store as before.

Production (a Redis broker): a notice is a ``PUBLISH`` on ``omnijobs:live:<job>``, and
each API process holds one pattern subscription for all of them (``RedisWatcher``) plus
a channel of its own (its inbox), named in ``omnijobs:wait:<job>`` by a wait that expects
the result, where only that process receives the result's bytes; a
listened-to job's chunks go to a Redis Stream ``omnijobs:audio:<job>`` (capped, expiring)
that readers page through by entry id, so a reader that starts late loses nothing.

Embedded (``omnijobs dev``): worker, maintenance and API are separate processes on one
machine, so the spool folder ``OMNIJOBS_HOME/live`` carries both: ``<job>/`` exists while
someone watches (``listening`` in it once someone wants the audio), its ``notice`` file
is replaced on every notice (``SpoolWatcher`` looks at the watched ones every few
milliseconds, in the event loop, without a thread), and each chunk is one ``.npy`` file,
named so that names sort in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from core.settings import Settings

log = logging.getLogger(__name__)

NOTICE = "omnijobs:live:"
AUDIO = "omnijobs:audio:"
LISTEN = "omnijobs:listen:"
WAIT = "omnijobs:wait:"
INBOX = "omnijobs:inbox:"
RUNNING = b"running"  # a notice's body: the job runs on (claim, progress, audio); else b"1"
# A result handed to a waiting request with its completion is at most this large (a few
# seconds of WAV); a larger one is read from the store. Every byte passes through Redis.
HANDOFF_MAX_BYTES = 1 << 20
AUDIO_TTL_S = 600  # a stream's chunks outlive its last chunk by this much
LISTEN_TTL_S = 3600
AUDIO_MAXLEN = 20_000
SPOOL_POLL_S = 0.005


@dataclass(frozen=True)
class Chunk:
    """Samples one chunk added to attempt ``attempt`` of a job; ``cursor`` reads on."""

    cursor: str
    attempt: int
    samples: np.ndarray  # (channels, k) float32
    sample_rate: int


@dataclass(frozen=True)
class Result:
    """A completed job's single output, handed to the process waiting for it: the
    bytes that were stored under the job's output record, and their content type."""

    job_id: str
    attempt: int
    content_type: str
    data: bytes

    def encode(self) -> bytes:
        head = json.dumps({"job": self.job_id, "attempt": self.attempt,
                           "type": self.content_type}).encode()
        return head + b"\n" + self.data

    @classmethod
    def decode(cls, raw: bytes) -> Result:
        head, _, data = raw.partition(b"\n")
        meta = json.loads(head)
        return cls(str(meta["job"]), int(meta["attempt"]), str(meta["type"]), data)


class Bus:
    """The sending side (sync: workers, and routes that change a job) plus chunk reads."""

    # Whether ``watch`` does anything (a file system call, for the spool): where it does
    # not, a watcher skips the trip to a worker thread.
    watches = False

    def notify(self, job_id: str, running: bool = False) -> None:
        """``running``: the job was claimed or made progress, and runs on (a hint a
        watcher that waits only for the end may act on without reading the job)."""
        raise NotImplementedError

    def watch(self, job_id: str) -> None:
        """Ask for notices of this job (every job's are sent in production)."""

    def listen(self, job_id: str) -> None:
        """Ask for this job's audio chunks (and its notices)."""
        raise NotImplementedError

    def expect_result(self, job_id: str, ttl_s: float) -> None:
        """Ask for this job's notices and, where the bus can carry it, its small result
        with the completion (for about ``ttl_s``)."""
        self.watch(job_id)

    def hand_result(self, result: Result) -> bool:
        """The worker, after recording the completion: give the result to the process
        that expects it, if one does (True when sent). The notice still follows."""
        return False

    def listening(self, job_id: str) -> bool:
        raise NotImplementedError

    def add_audio(self, job_id: str, attempt: int, seq: int, samples: np.ndarray,
                  sample_rate: int) -> None:
        raise NotImplementedError

    def read_audio(self, job_id: str, after: str) -> list[Chunk]:
        raise NotImplementedError

    def watcher(self) -> Watcher:
        raise NotImplementedError


class RedisBus(Bus):
    """Every call bounded (storage/redisconn.py), and skipped for a moment after Redis
    failed: callers treat a failed notice or chunk as they treat a lost one."""

    def __init__(self, settings: Settings) -> None:
        from .redisconn import Breaker, redis_client

        self.settings = settings
        self._client = redis_client(settings)
        self._breaker = Breaker()
        self.inbox = INBOX + uuid.uuid4().hex  # this process's own channel (its watcher's)

    def notify(self, job_id: str, running: bool = False) -> None:
        with self._breaker:
            self._client.publish(NOTICE + job_id, RUNNING if running else b"1")

    def expect_result(self, job_id: str, ttl_s: float) -> None:
        with self._breaker:
            self._client.set(WAIT + job_id, self.inbox, ex=max(1, int(ttl_s) + 1))

    def hand_result(self, result: Result) -> bool:
        if len(result.data) > HANDOFF_MAX_BYTES:
            return False
        with self._breaker:
            inbox = self._client.get(WAIT + result.job_id)
            if inbox is None:
                return False
            self._client.publish(inbox, result.encode())
        return True

    def listen(self, job_id: str) -> None:
        with self._breaker:
            self._client.set(LISTEN + job_id, b"1", ex=LISTEN_TTL_S)

    def listening(self, job_id: str) -> bool:
        with self._breaker:
            return bool(self._client.exists(LISTEN + job_id))

    def add_audio(self, job_id: str, attempt: int, seq: int, samples: np.ndarray,
                  sample_rate: int) -> None:
        data = np.ascontiguousarray(samples, dtype=np.float32)
        pipe = self._client.pipeline(transaction=False)
        pipe.xadd(AUDIO + job_id, {"a": attempt, "r": sample_rate, "c": data.shape[0],
                                   "d": data.tobytes()}, maxlen=AUDIO_MAXLEN, approximate=True)
        pipe.expire(AUDIO + job_id, AUDIO_TTL_S)
        pipe.publish(NOTICE + job_id, RUNNING)
        with self._breaker:
            pipe.execute()

    def read_audio(self, job_id: str, after: str) -> list[Chunk]:
        start = f"({after}" if after else "-"
        with self._breaker:
            entries = self._client.xrange(AUDIO + job_id, min=start)
        chunks = []
        for entry_id, f in entries:
            channels = int(f[b"c"])
            samples = np.frombuffer(f[b"d"], dtype=np.float32).reshape(channels, -1)
            chunks.append(Chunk(entry_id.decode(), int(f[b"a"]), samples, int(f[b"r"])))
        return chunks

    def watcher(self) -> Watcher:
        return RedisWatcher(self.settings, self.inbox)


class SpoolBus(Bus):
    def __init__(self, root: Path) -> None:
        self.root = root
        self._pruned = 0.0

    def _dir(self, job_id: str) -> Path:
        return self.root / job_id

    def notify(self, job_id: str, running: bool = False) -> None:
        folder = self._dir(job_id)
        if folder.is_dir():
            _replace(folder / "notice", str(time.time_ns()).encode())

    watches = True

    def watch(self, job_id: str) -> None:
        self._dir(job_id).mkdir(parents=True, exist_ok=True)
        if time.monotonic() - self._pruned > 60:
            self._pruned = time.monotonic()
            prune(self.root, LISTEN_TTL_S)

    def listen(self, job_id: str) -> None:
        self.watch(job_id)
        (self._dir(job_id) / "listening").touch()

    def listening(self, job_id: str) -> bool:
        return (self._dir(job_id) / "listening").exists()

    def add_audio(self, job_id: str, attempt: int, seq: int, samples: np.ndarray,
                  sample_rate: int) -> None:
        folder = self._dir(job_id)
        tmp = folder / f".{attempt}-{seq}.tmp"
        with open(tmp, "wb") as f:
            np.save(f, np.ascontiguousarray(samples, dtype=np.float32))
        os.replace(tmp, folder / f"a-{attempt:04d}-{seq:09d}-{sample_rate}.npy")
        self.notify(job_id)

    def read_audio(self, job_id: str, after: str) -> list[Chunk]:
        folder = self._dir(job_id)
        try:
            names = sorted(n for n in os.listdir(folder) if n.startswith("a-") and n > after)
        except FileNotFoundError:
            return []
        chunks = []
        for name in names:
            _, attempt, _, rate = name.removesuffix(".npy").split("-")
            chunks.append(Chunk(name, int(attempt), np.load(folder / name), int(rate)))
        return chunks

    def watcher(self) -> Watcher:
        return SpoolWatcher(self.root)


def _replace(path: Path, data: bytes) -> None:
    """A new file each time (a new inode), so a watcher sees two notices apart even
    within one tick of the file system's clock."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def prune(root: Path, older_than_s: float) -> None:
    """Spool folders nobody touched for a while (their streams ended long ago)."""
    cutoff = time.time() - older_than_s
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(root):
            with contextlib.suppress(OSError):
                if entry.is_dir() and entry.stat().st_mtime < cutoff:
                    shutil.rmtree(entry.path, ignore_errors=True)


def make_bus(settings: Settings) -> Bus:
    if settings.broker.startswith(("redis://", "rediss://")):
        return RedisBus(settings)
    return SpoolBus(settings.live_dir)


UNREAD = object()  # a watcher that has not read its job yet: no resync can tell it news


class Subscription:
    """One watcher of one job: ``wait`` returns True on a notice, False on a timeout.
    ``seen`` is what the watcher last read of its job (its resync compares it)."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.seen: object = UNREAD
        self.result: Result | None = None  # handed with the completion (``expect_result``)
        # Woken for something other than "still running" since the watcher last read
        # its job (any notice without that hint, a resync that saw a change).
        self.changed = False

    async def wait(self, timeout_s: float) -> bool:
        # ``asyncio.timeout``, not ``wait_for``: on Python 3.11 ``wait_for`` wraps the
        # wait in a task of its own, one more object per idle watcher.
        try:
            async with asyncio.timeout(max(0.0, timeout_s)):
                await self.event.wait()
        except TimeoutError:
            return False
        self.event.clear()
        return True


class Watcher:
    """The receiving side in an API process: one task per event loop serves every
    subscription, so an idle stream is an ``asyncio.Event`` and nothing more."""

    def __init__(self) -> None:
        self._subs: dict[str, set[Subscription]] = {}
        self._task: asyncio.Task | None = None

    @contextlib.contextmanager
    def subscribe(self, *job_ids: str) -> Iterator[Subscription]:
        """One subscription woken by a notice of any of these jobs (a list of jobs
        watches its rows with one)."""
        self._ensure_running()
        sub = Subscription()
        for job_id in job_ids:
            self._subs.setdefault(job_id, set()).add(sub)
        try:
            yield sub
        finally:
            for job_id in job_ids:
                subs = self._subs.get(job_id, set())
                subs.discard(sub)
                if not subs:
                    self._subs.pop(job_id, None)

    @property
    def active(self) -> int:
        return sum(len(s) for s in self._subs.values())

    def subscriptions(self) -> dict[str, list[Subscription]]:
        """Every job watched in this event loop and its watchers, as they are now."""
        return {job_id: list(subs) for job_id, subs in self._subs.items()}

    def wake(self, job_id: str, running: bool = False) -> None:
        for sub in self._subs.get(job_id, ()):
            sub.changed = sub.changed or not running
            sub.event.set()

    def hand(self, result: Result) -> None:
        """A result for the watchers of its job (and a wake-up)."""
        for sub in self._subs.get(result.job_id, ()):
            sub.result = result
            sub.event.set()

    def wake_all(self) -> None:
        for job_id in list(self._subs):
            self.wake(job_id)

    def _ensure_running(self) -> None:
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._task = loop.create_task(self._run())

    async def _run(self) -> None:
        raise NotImplementedError


class RedisWatcher(Watcher):
    """One pattern subscription per event loop. A subscription can go quiet without
    closing (a frozen Redis, a half-open connection), so after ``health_check_s`` of
    silence it is pinged, and one that does not answer within as long again is dropped
    and made again (a busy host is not taken for a dead one); meanwhile the watchers'
    database resync carries on."""

    def __init__(self, settings: Settings, inbox: str | None = None) -> None:
        super().__init__()
        self.settings, self.inbox = settings, inbox

    async def _run(self) -> None:
        from .redisconn import async_redis_client

        while True:
            client = async_redis_client(self.settings)
            try:
                async with client.pubsub() as pubsub:
                    if self.inbox is not None:
                        await pubsub.subscribe(self.inbox)
                    await pubsub.psubscribe(NOTICE + "*")
                    await self._listen(pubsub)
            except asyncio.CancelledError:
                raise
            except Exception:  # Redis away: watchers fall back on their resync timers
                log.warning("live notices: Redis subscription lost; reconnecting",
                            exc_info=True)
                await asyncio.sleep(1.0)
            finally:
                await client.aclose()

    async def _listen(self, pubsub) -> None:
        from .redisconn import health_check_s

        quiet_s = health_check_s(self.settings)
        while True:
            msg = await pubsub.get_message(timeout=quiet_s)
            if msg is None:  # quiet for a while: is anyone there?
                await pubsub.ping()
                msg = await pubsub.get_message(timeout=quiet_s)
                if msg is None:
                    raise TimeoutError(f"no answer from Redis in {quiet_s:g}s")
            if msg["type"] == "pmessage":
                self.wake(msg["channel"].decode()[len(NOTICE):], msg["data"] == RUNNING)
            elif msg["type"] == "message":
                self._handed(msg["data"])
            elif msg["type"] == "psubscribe":
                self.wake_all()  # (subscribed again) anything sent meanwhile is re-read


    def _handed(self, raw: bytes) -> None:
        try:
            result = Result.decode(raw)
        except (ValueError, KeyError, TypeError):  # not ours to read: the notice follows
            log.warning("live notices: unreadable result message dropped")
            return
        self.hand(result)


class SpoolWatcher(Watcher):
    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    async def _run(self) -> None:
        seen: dict[str, tuple[int, int] | None] = {}
        while True:
            await asyncio.sleep(SPOOL_POLL_S)
            for job_id in list(self._subs):
                try:
                    st = os.stat(self.root / job_id / "notice")
                    mark = (st.st_ino, st.st_mtime_ns)
                except OSError:
                    mark = None
                if job_id in seen and seen[job_id] != mark:
                    self.wake(job_id)
                seen[job_id] = mark
            for job_id in set(seen) - set(self._subs):
                del seen[job_id]
