"""The bus's two sides, whatever carries them: ``Bus`` sends notices, results and
audio chunks (workers, and routes that change a job) and reads chunks back; a ``Watcher``
in an API process wakes the ``Subscription`` of every request watching a job."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

# A result handed to a waiting request with its completion is at most this large (a few
# seconds of WAV); a larger one is read from the store. Every byte passes through Redis.
HANDOFF_MAX_BYTES = 1 << 20
# How long a request for a job's chunks lasts (Redis), and a spool folder nobody touches.
LISTEN_TTL_S = 3600


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
