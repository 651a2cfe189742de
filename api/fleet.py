"""What the API knows of the workers: which pipelines some live worker serves.

Read from the worker registry (``storage/repositories/workers.py``), at most once per
``TTL_S`` per API process, so a page of queued jobs costs no query per job. Shown as a
queued job's ``status_detail`` ("waiting for a worker"); ``/readyz`` reads the registry
itself.
"""

from __future__ import annotations

import logging
import threading
import time

from core.jobs import JobStatus
from storage.records import JobRecord
from storage.repositories import WorkerRepository
from storage.views import WAITING_FOR_A_WORKER

log = logging.getLogger(__name__)

TTL_S = 2.0


class Fleet:
    """Never blocks a request: a stale answer starts a refresh on a thread of its own
    and is used meanwhile (routes on the event loop ask too, submit answers among them)."""

    def __init__(self, workers: WorkerRepository, ttl_s: float = TTL_S) -> None:
        self.workers, self._ttl_s = workers, ttl_s
        self._lock = threading.Lock()
        self._counts: dict[str, int] | None = None
        self._read_at = float("-inf")
        self._reading = False

    def served(self) -> frozenset[str] | None:
        """The pipelines a live, non-draining worker takes jobs for, as last read; None
        before the first read and while the registry cannot be read (then nothing is
        claimed about any job)."""
        counts = self.counts()
        return None if counts is None else frozenset(p for p, n in counts.items() if n)

    def workers_for(self, pipeline: str) -> int | None:
        """Live, non-draining workers serving ``pipeline`` (None: not known)."""
        counts = self.counts()
        return None if counts is None else counts.get(pipeline, 0)

    def counts(self) -> dict[str, int] | None:
        with self._lock:
            if not self._reading and time.monotonic() - self._read_at >= self._ttl_s:
                self._reading = True
                threading.Thread(target=self._read, name="fleet-read", daemon=True).start()
            return self._counts

    def _read(self) -> None:
        try:
            counts: dict[str, int] | None = self.workers.serving(())
        except Exception:
            log.warning("worker registry unreadable", exc_info=True)
            counts = None
        with self._lock:
            self._counts, self._read_at, self._reading = counts, time.monotonic(), False

    def detail(self, job: JobRecord) -> str | None:
        """Why a queued job waits, when the registry says: no live worker serves it."""
        if job.status is not JobStatus.QUEUED:
            return None
        served = self.served()
        return WAITING_FOR_A_WORKER if served is not None and job.pipeline not in served \
            else None
