"""The maintenance process: recovery, retention and the CPU-side Celery queues.

Every step runs on its own thread and its own period, inside a process that never
renders, so no render backlog and no slow step (an orphan sweep over a large bucket)
can hold up the relay or the reaper. The steps call the database and the store
directly, not through broker messages that could wait behind render work or expire.
The same process consumes ``MAINTENANCE_QUEUES`` (webhook deliveries) with a thread
pool. Run exactly one per deployment (``omnijobs maintenance``); a second one is safe,
since every step is a compare-and-set, but it publishes some messages twice.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

from celery import Celery

from .app import run_worker
from .batches import advance_batches
from .deliver import schedule_due
from .dispatch import MAINTENANCE_QUEUES
from .fleet import serve_metrics
from .recovery import (
    expire_overdue,
    prune_outbox,
    reap_leases,
    relay_outbox,
    sweep_stale_queued,
)
from .retention import apply_retention, sweep_orphans
from .runtime import WorkerRuntime

log = logging.getLogger(__name__)

Step = Callable[[WorkerRuntime, Celery], int]

STEPS: dict[str, Step] = {
    "relay": relay_outbox,
    "reap": reap_leases,
    "sweep_queued": sweep_stale_queued,
    "deadlines": expire_overdue,
    "retention": apply_retention,
    "orphans": sweep_orphans,
    "prune_outbox": prune_outbox,
    "webhooks": schedule_due,
    "batches": advance_batches,
    "prune_workers": lambda rt, _app: rt.workers.prune(WORKER_ROWS_KEPT_S),
}
PERIODS: dict[str, float] = {  # seconds; OMNIJOBS_MAINTENANCE_PERIODS overrides them
    "relay": 5.0,
    "reap": 10.0,
    "sweep_queued": 60.0,
    "deadlines": 2.0,  # a partial index of the queued jobs with a deadline: cheap
    "retention": 600.0,
    "orphans": 3600.0,
    "prune_outbox": 3600.0,
    "webhooks": 1.0,
    "batches": 0.5,
    "prune_workers": 600.0,
}
WORKER_ROWS_KEPT_S = 3600.0  # a dead process's registry row is listed this long


def periods(overrides: dict[str, float]) -> dict[str, float]:
    unknown = sorted(set(overrides) - set(STEPS))
    if unknown:
        raise ValueError(f"OMNIJOBS_MAINTENANCE_PERIODS: unknown steps {unknown}; "
                         f"known: {sorted(STEPS)}")
    if any(v <= 0 for v in overrides.values()):
        raise ValueError("OMNIJOBS_MAINTENANCE_PERIODS: periods must be positive")
    return {**PERIODS, **overrides}


class Maintenance:
    """One daemon thread per step; each runs its step, then waits its period."""

    def __init__(self, rt: WorkerRuntime, app: Celery) -> None:
        self.rt, self.app = rt, app
        self.periods = periods(rt.settings.maintenance_periods)
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=(name,), daemon=True,
                                          name=f"maintenance-{name}") for name in STEPS]

    def run_once(self, name: str) -> int:
        try:
            done = STEPS[name](self.rt, self.app)
        except Exception:  # a dependency down: log it and try again next period
            log.warning("maintenance step %s failed; retrying in %gs", name,
                        self.periods[name], exc_info=True)
            return 0
        if done:
            log.info("maintenance step %s: %d done", name, done)
        return done

    def _loop(self, name: str) -> None:
        while not self._stop.is_set():
            self.run_once(name)
            self._stop.wait(self.periods[name])

    def start(self) -> Maintenance:
        for thread in self._threads:
            thread.start()
        log.info("maintenance running: %s", ", ".join(
            f"{n} every {p:g}s" for n, p in self.periods.items()))
        return self

    def stop(self) -> None:
        self._stop.set()


def run(rt: WorkerRuntime, app: Celery, loglevel: str, concurrency: int = 4,
        metrics_port: int | None = None) -> None:
    """The steps on their threads, and a Celery worker (threads pool) for the CPU queues
    on the main thread, until a signal stops it (without Celery's banner: plain text
    that the process's log lines already say). ``metrics_port`` serves this process's
    metrics and the fleet's gauges."""
    if metrics_port is not None:
        serve_metrics(rt, metrics_port)
    rt.announce("maintenance")
    upkeep = Maintenance(rt, app).start()
    try:
        run_worker(app, f"maintenance-{os.getpid()}", list(MAINTENANCE_QUEUES), loglevel,
                   threads=concurrency)
    finally:
        upkeep.stop()
        rt.retire()
