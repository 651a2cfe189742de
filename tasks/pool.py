"""Finalize in the background so the accelerator starts the next job at once.

A worker generates job k+1 while one thread validates, muxes, probes and uploads job
k. ``backlog`` bounds how many generated results may wait for finalize, so a slow
finalize holds generation back instead of filling memory. A worker with several slots
finalizes on as many threads, up to four: jobs that started together in one batch leave
the engine in the same step, and one thread would upload them one after another. A
process that dies with work in here loses nothing durable: those jobs' leases expire and
the reaper re-queues them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor


class FinalizePool:
    def __init__(self, backlog: int = 1, workers: int = 1) -> None:
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="finalize")
        self._slots = threading.BoundedSemaphore(workers + backlog)

    def submit(self, fn: Callable[..., str], *args) -> Future:
        self._slots.acquire()  # blocks generation when finalize is behind
        try:
            future = self._executor.submit(fn, *args)
        except BaseException:
            self._slots.release()
            raise
        future.add_done_callback(lambda _f: self._slots.release())
        return future

    def drain(self) -> None:
        """Wait for everything submitted so far (worker shutdown)."""
        self._executor.shutdown(wait=True)
