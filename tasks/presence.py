"""This process's row in the worker registry (``storage/repositories/workers.py``).

A daemon thread writes it every ``OMNIJOBS_WORKER_HEARTBEAT_S`` and within
``POKE_DELAY_S`` when something readers care about changes (a job claimed or recorded,
a drain begun); the row counts as alive for ``TTL_BEATS`` periods, so a process that
dies without a word drops out of every reader's view after that, and one that stops
cleanly deletes it.
A database blip costs a beat, never the process.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from importlib.metadata import version

from storage.records import InFlightJob, WorkerBeat
from storage.repositories import WorkerRepository

log = logging.getLogger(__name__)

TTL_BEATS = 3  # a row not renewed for this many periods is a dead process
# A poke's write waits this long: it lands after the claim or completion that poked it
# rather than beside it (they share the process and the database), and a short job's
# two changes make one write.
POKE_DELAY_S = 0.2


def describe(worker_id: str, role: str, pipelines: list[str],
             engine: bool = False) -> WorkerBeat:
    """Who this process is: host, pid, what it serves, on which device, which release.
    An engine worker in a container has no CUDA_VISIBLE_DEVICES (the runtime gave it its
    GPUs): it runs on every GPU it sees."""
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES")
    device = f"gpu {gpus}" if gpus else ("gpu (all visible)" if engine else "cpu")
    return WorkerBeat(id=worker_id, role=role, host=socket.gethostname(), pid=os.getpid(),
                      pipelines=tuple(pipelines), device=device,
                      version=version("omnijobs"), started_at=datetime.now(UTC))


@dataclass(frozen=True)
class SlotView:
    """What a worker's engine holds now, as the registry and the fleet signals read it.

    ``busy`` counts engine slots held by jobs still generating (a guided job holds two);
    ``jobs`` lists every job in flight, those whose engine part is done and that only
    wait for their mux and upload (``finalizing``, holding no slot) among them.
    """

    total: int = 1
    busy: int = 0
    jobs: tuple[InFlightJob, ...] = ()


class Presence:
    def __init__(self, workers: WorkerRepository, identity: WorkerBeat, period_s: float,
                 current_job: Callable[[], str | None] = lambda: None,
                 draining: Callable[[], bool] = lambda: False,
                 slots: Callable[[], SlotView] | None = None) -> None:
        self._workers, self.identity, self.period_s = workers, identity, period_s
        self._current_job, self._draining = current_job, draining
        # The runtime tells what its engine holds; until it does, one slot, busy while
        # there is a current job.
        self._slots = slots or (lambda: SlotView(busy=int(self._current_job() is not None)))
        self._wake, self._stopped = threading.Event(), threading.Event()
        self._lock = threading.Lock()  # no beat lands after the row was removed
        self._thread = threading.Thread(target=self._run, name="presence", daemon=True)

    def start(self) -> Presence:
        self._thread.start()
        return self

    def poke(self) -> None:
        """Something changed: write the row now rather than at the next period."""
        self._wake.set()

    def beat(self) -> None:
        with self._lock:
            if self._stopped.is_set():
                return
            try:
                view = self._slots()
                self._workers.beat(replace(self.identity, job_id=self._current_job(),
                                           draining=self._draining(), slots=view.total,
                                           slots_busy=view.busy, in_flight=view.jobs),
                                   ttl_s=TTL_BEATS * self.period_s)
            except Exception:  # the database is down: the row's slack covers a few beats
                log.warning("worker registry heartbeat failed", exc_info=True)

    def _run(self) -> None:
        while not self._stopped.is_set():
            self._wake.clear()
            self.beat()
            if self._wake.wait(self.period_s):
                self._stopped.wait(POKE_DELAY_S)

    def stop(self) -> None:
        """The process is leaving: its row goes with it (best effort; else it expires)."""
        with self._lock:
            if self._stopped.is_set():
                return
            self._stopped.set()
            self._wake.set()
            try:
                self._workers.remove(self.identity.id)
            except Exception:
                log.warning("could not remove this worker's registry row; it will expire",
                            exc_info=True)
