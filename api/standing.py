"""Queue position and estimates for the jobs an API process shows (``GET``, the event
stream's ``queue`` events).

A lane's picture (``StandingRepository.lane``: a few grouped reads) is kept for
``TTL_S`` per API process and shared by every job waiting in that lane, so a job costs
one index count of its own; the live workers come from the registry view (api/fleet.py),
read directly the first time.
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

    def of(self, job: JobRecord) -> QueueStanding | None:
        """None unless the job is queued."""
        if job.status is not JobStatus.QUEUED:
            return None
        lane = self._lane(job.pipeline, lane_of(job.batch_id))
        return eta.standing(lane, job, self.repo.rank(job), self._workers(job.pipeline))

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
        key, now = (pipeline, lane), time.monotonic()
        with self._lock:
            kept = self._lanes.get(key)
        if kept is not None and now - kept[0] < self._ttl_s:
            return kept[1]
        picture = self.repo.lane(pipeline, lane)
        with self._lock:
            self._lanes[key] = (now, picture)
        return picture
