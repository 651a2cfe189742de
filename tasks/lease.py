"""Lease heartbeat and runtime watchdog for a running job.

A background thread extends the lease and flushes progress while the pipeline works.
When the heartbeat's compare-and-set stops matching (the job was cancelled, or a
reaper handed it to another worker) the job is no longer ours: the pipeline is told
to stop at its next chunk. So it is when no heartbeat could be confirmed within the
lease (a database that fails or stalls): the reaper may have handed the job on by then.
The lease is renewed only while the job is within its pipeline's maximum runtime; past
it the watchdog calls ``on_timeout`` (which records the timeout and recycles the
process, since a stuck call cannot be interrupted).

A started lease is in its process's ``InFlight`` set until it stops (the job recorded):
what a draining worker waits for, and what it hands back when its drain time is up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from storage.db import answer_within
from storage.repositories import JobRepository

log = logging.getLogger(__name__)

RETRY_S = 0.5  # between the upload guard's heartbeat tries
MIN_ANSWER_S = 0.2  # the least a heartbeat waits for the database's answer
# New progress is recorded (and announced) within this long, not only at the next beat:
# a job shorter than the beat interval still shows how it goes, and a watcher hears of
# it while it runs. One UPDATE per running job at most this often.
PROGRESS_EVERY_S = 0.5


class InFlight:
    """The leases a process holds: its jobs from claim until recorded (generating, or
    waiting for and in finalize)."""

    def __init__(self, on_change: Callable[[], None] = lambda: None) -> None:
        self._leases: list[Lease] = []
        self._changed = threading.Condition()
        self.on_change = on_change  # e.g. the registry's heartbeat, to say so at once

    def add(self, lease: Lease) -> None:
        with self._changed:
            self._leases.append(lease)
            self._changed.notify_all()
        self.on_change()

    def discard(self, lease: Lease) -> None:
        with self._changed:
            if lease not in self._leases:
                return
            self._leases.remove(lease)
            self._changed.notify_all()
        self.on_change()

    def leases(self) -> list[Lease]:
        with self._changed:
            return list(self._leases)

    def newest(self) -> str | None:
        """The job claimed last (the one generating, when one is)."""
        with self._changed:
            return self._leases[-1].job_id if self._leases else None

    def wait_empty(self, timeout_s: float) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: not self._leases, max(0.0, timeout_s))


class Lease:
    def __init__(self, jobs: JobRepository, job_id: str, attempt: int, lease_s: float,
                 max_runtime_s: float = float("inf"),
                 on_timeout: Callable[[], None] = lambda: None,
                 on_progress: Callable[[], None] = lambda: None,
                 pipeline: str = "", in_flight: InFlight | None = None) -> None:
        self._jobs, self.job_id, self.attempt, self.lease_s = jobs, job_id, attempt, lease_s
        self.max_runtime_s, self._on_timeout = max_runtime_s, on_timeout
        self.pipeline, self._in_flight = pipeline, in_flight
        self.handed_back = False
        self.generated = False  # the engine's part is done; finalize may still run
        self.own_deadline = False  # max_runtime_s is the caller's max_run_s, not the pipeline's
        self.render: tuple[float, str | None] | None = None  # the attempt's time, once taken
        self._on_progress = on_progress  # a new progress is recorded: tell the listeners
        self._started = time.monotonic()
        self._confirmed_at = self._started  # the claim gave us the lease
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._nudge = threading.Event()  # beat now, not at the next tick
        self._progress: int | None = None
        self._sent: int | None = None
        self._progress_at = self._started  # when progress was last recorded
        self._thread = threading.Thread(target=self._run, name=f"lease-{job_id}", daemon=True)

    def mark_generated(self) -> None:
        """The engine's part is done: the job holds no slot now, only its finalize is
        left (the registry's row says so at once)."""
        self.generated = True
        if self._in_flight is not None:
            self._in_flight.on_change()

    def report_progress(self, fraction: float) -> None:
        self._progress = int(max(0.0, min(1.0, fraction)) * 99)
        if (self._progress != self._sent
                and time.monotonic() - self._progress_at >= PROGRESS_EVERY_S):
            self._nudge.set()  # the lease's thread records it now

    def is_cancelled(self) -> bool:
        return self.lost.is_set()

    def overdue(self) -> bool:
        return time.monotonic() - self._started > self.max_runtime_s

    def elapsed(self) -> float:
        """Seconds since the claim: the attempt's wall time in the pipeline so far."""
        return time.monotonic() - self._started

    def wait_stopped(self, timeout_s: float) -> bool:
        """Wait until the job is recorded (``stop``) or ``timeout_s`` passes; True if it
        was recorded."""
        return self._stop.wait(timeout_s)

    def lost_now(self) -> bool:
        """Heartbeat now (not at the next tick) and say whether the job is lost: called
        right before an upload, so a reclaimed attempt doesn't overwrite a newer one.
        Only a confirmed heartbeat keeps the job: one that fails or gets no answer is
        tried again until the lease, as last confirmed, has run out, and then the job is
        lost (the reaper may have handed it to another worker meanwhile)."""
        while not self.lost.is_set():
            if self.beat():
                return False
            if not self.lost.is_set():
                time.sleep(min(RETRY_S, self.lease_s / 10))
        return True

    def lost_unless_recent(self) -> bool:
        """Before an upload: is the job lost? A heartbeat confirmed within the last beat
        interval is taken as current (the lease it renewed has most of its time left);
        an older one is renewed now (``lost_now``). Object keys name their attempt, so
        an upload can never overwrite another attempt's output; this only spares the
        upload of a job that is no longer ours."""
        if self.lost.is_set():
            return True
        if time.monotonic() - self._confirmed_at < self.interval_s:
            return False
        return self.lost_now()

    def beat(self) -> bool:
        """One heartbeat; True when confirmed (the lease renewed, the job still ours).
        It waits no longer than the lease has left, so a stalled database cannot hold
        it past the point where the job may be someone else's."""
        if self.overdue():  # never renewed past the maximum runtime
            self.lost.set()
            return False
        progress = self._progress if self._progress != self._sent else None
        sent_at = time.monotonic()
        try:
            with answer_within(max(MIN_ANSWER_S, self._confirmed_at + self.lease_s - sent_at)):
                alive = self._jobs.heartbeat(self.job_id, self.attempt, self.lease_s, progress)
        except Exception:  # a database blip must not kill the job while the lease lasts
            log.warning("heartbeat failed for %s", self.job_id, exc_info=True)
            if time.monotonic() - self._confirmed_at >= self.lease_s:
                log.warning("lease of %s not renewed within %gs: the job is lost",
                            self.job_id, self.lease_s, extra={"job_id": self.job_id})
                self.lost.set()
            return False
        if progress is not None:
            self._sent, self._progress_at = progress, time.monotonic()
        if not alive:
            self.lost.set()
            return False
        self._confirmed_at = sent_at
        if progress is not None:
            self._on_progress()
        return True

    @property
    def interval_s(self) -> float:
        """Between two heartbeats of the lease's thread."""
        return min(self.lease_s / 3, 2.0)

    def _run(self) -> None:
        while True:
            self._nudge.wait(self.interval_s)
            self._nudge.clear()
            if self._stop.is_set():
                return
            if self.overdue():
                self.lost.set()
                if not self._stop.is_set():
                    self._on_timeout()
                return
            self.beat()

    def start(self) -> Lease:
        if self._in_flight is not None:
            self._in_flight.add(self)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._nudge.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
        if self._in_flight is not None:
            self._in_flight.discard(self)

    def let_go(self) -> None:
        """The worker hands the job back (drain): no more heartbeats, and the pipeline
        and finalize see the job as no longer theirs at their next check."""
        self.handed_back = True
        self._stop.set()
        self._nudge.set()
        self.lost.set()

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
