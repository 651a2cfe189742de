"""Queue position and estimates for the jobs an API process shows (``GET``, the event
stream's ``queue`` events).

A lane's picture (``StandingRepository.lane``: a few grouped reads) is kept for
``TTL_S`` per API process and shared by every job waiting in that lane, and so are the
ranks of the jobs asked about lately: one query numbers them all (``ranks``), read
again at most every ``TTL_S``, so a thousand queued streams reading their place every
couple of seconds cost the database one query a lane, not a thousand counts. A job the
board does not hold yet costs one index count of its own, once. The live workers come
from the registry view (api/fleet.py), read directly the first time.
"""

from __future__ import annotations

import threading
import time

from core.jobs import JobStatus
from storage import eta
from storage.records import JobRecord, LanePicture, QueueStanding
from storage.repositories.fair import lane_of
from storage.repositories.standing import StandingRepository

from .fleet import Fleet

TTL_S = 2.0


class Standings:
    def __init__(self, repo: StandingRepository, fleet: Fleet | None,
                 ttl_s: float = TTL_S) -> None:
        self.repo, self.fleet, self._ttl_s = repo, fleet, ttl_s
        self._lock = threading.Lock()
        self._lanes: dict[tuple[str, str], tuple[float, LanePicture]] = {}
        self._boards: dict[tuple[str, str], _Board] = {}
        self._reading: dict[tuple[str, str], threading.Lock] = {}

    def of(self, job: JobRecord) -> QueueStanding | None:
        """None unless the job is queued."""
        if job.status is not JobStatus.QUEUED:
            return None
        key = (job.pipeline, lane_of(job.batch_id))
        lane = self._lane(*key)
        with self._lock:
            board = self._boards.setdefault(key, _Board())
        return eta.standing(lane, job, board.rank(self.repo, key, job, self._ttl_s),
                            self._workers(job.pipeline))

    def known(self, job: JobRecord) -> QueueStanding | None:
        """``of``, where everything it needs was read within ``ttl_s`` (the lane's
        picture, the job's place on the board, the workers): no I/O, so an event loop
        may ask; None where something must be read."""
        if job.status is not JobStatus.QUEUED or self.fleet is None:
            return None
        key, now = (job.pipeline, lane_of(job.batch_id)), time.monotonic()
        counts = self.fleet.counts()
        with self._lock:
            kept, board = self._lanes.get(key), self._boards.get(key)
        if counts is None or kept is None or now - kept[0] >= self._ttl_s or board is None:
            return None
        rank = board.fresh_rank(job, self._ttl_s)
        if rank is None:
            return None
        return eta.standing(kept[1], job, rank, counts.get(job.pipeline, 0))

    def _workers(self, pipeline: str) -> int | None:
        if self.fleet is None:
            return None
        counts = self.fleet.counts()
        if counts is None:  # not read yet (or unreadable): ask once, here
            try:
                counts = self.fleet.workers.serving(())
            except Exception:
                return None
        return counts.get(pipeline, 0)

    def _lane(self, pipeline: str, lane: str) -> LanePicture:
        """The lane's picture, read again once older than ``ttl_s``: by one caller, the
        others waiting for what it reads (a thousand streams see it stale at once)."""
        key = (pipeline, lane)
        with self._lock:
            kept = self._lanes.get(key)
            reading = self._reading.setdefault(key, threading.Lock())
        if kept is not None and time.monotonic() - kept[0] < self._ttl_s:
            return kept[1]
        with reading:
            with self._lock:
                kept = self._lanes.get(key)
            if kept is not None and time.monotonic() - kept[0] < self._ttl_s:
                return kept[1]
            now = time.monotonic()
            picture = self.repo.lane(pipeline, lane)
            with self._lock:
                self._lanes[key] = (now, picture)
            return picture


KEEP_ASKED = 10  # a job not asked about for this many periods leaves the board


class _Board:
    """One lane's ranks of the jobs asked about lately (within ``KEEP_ASKED`` periods:
    a loaded process asks late, and a job dropped would cost a count of its own again),
    read for all of them at once when the last reading is older than ``ttl_s``; one
    reader at a time, the others take what it read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._asked: dict[str, tuple[float, JobRecord]] = {}
        self._read_at = float("-inf")
        self._ranks: dict[str, int] = {}

    def fresh_rank(self, job: JobRecord, ttl_s: float) -> int | None:
        """The job's place as last read, if that reading is recent and held it (and the
        job counts as asked about again)."""
        with self._lock:
            now = time.monotonic()
            if now - self._read_at >= ttl_s or job.id not in self._ranks:
                return None
            self._asked[job.id] = (now, job)
            return self._ranks[job.id]

    def rank(self, repo: StandingRepository, key: tuple[str, str], job: JobRecord,
             ttl_s: float) -> int:
        with self._lock:
            now = time.monotonic()
            known = job.id in self._asked
            self._asked[job.id] = (now, job)
            if now - self._read_at >= ttl_s:
                self._asked = {i: a for i, a in self._asked.items()
                               if now - a[0] < KEEP_ASKED * ttl_s}
                self._ranks = repo.ranks(*key, [j for _, j in self._asked.values()])
                self._read_at, known = now, True
            if known and job.id in self._ranks:
                return self._ranks[job.id]
        return repo.rank(job)  # new here (or not ready): its own count, this once
