"""The fleet and the queue: a worker's heartbeat and its registry row, the queue's
signals per lane, a lane as the fair claim sees it, and a queued job's standing."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class WorkerProcess:
    """Who a process of the fleet is: what its heartbeat and its registry row share."""

    id: str
    role: str  # "worker" (renders) or "maintenance"
    host: str
    pid: int
    pipelines: tuple[str, ...]
    device: str | None
    version: str
    started_at: datetime


@dataclass(frozen=True)
class InFlightJob:
    """A job a worker holds: generating on its engine, or (``finalizing``) done there
    and waiting only for its mux and upload, holding no engine slot."""

    id: str
    pipeline: str
    finalizing: bool = False


@dataclass(frozen=True)
class SlotCount:
    """A pipeline's live workers that take its jobs, their engine slots in all and held,
    and the jobs only finalizing (on any live worker, a draining one included)."""

    workers: int = 0
    slots: int = 0
    busy: int = 0
    finalizing: int = 0


@dataclass(frozen=True)
class WorkerBeat(WorkerProcess):
    """What a process of the fleet says about itself in each heartbeat."""

    job_id: str | None = None  # the job it is generating, if any
    draining: bool = False  # told to stop: it claims nothing more
    slots: int = 1  # jobs its engine takes at once
    slots_busy: int = 0  # of those, held now (a guided job holds two)
    in_flight: tuple[InFlightJob, ...] = ()


@dataclass(frozen=True)
class WorkerRecord(WorkerProcess):
    heartbeat_at: datetime
    expires_at: datetime
    job_id: str | None
    draining_at: datetime | None
    slots: int = 1
    slots_busy: int = 0
    in_flight: tuple[InFlightJob, ...] = ()

    def serves(self, pipeline: str) -> bool:
        """A render worker that takes this pipeline's jobs (a draining one takes none)."""
        return self.role == "worker" and self.draining_at is None and pipeline in self.pipelines


@dataclass(frozen=True)
class LaneSignals:
    """One pipeline's lane (``interactive``: jobs of no batch; ``bulk``: a batch's jobs)
    as the database has it: jobs waiting, the oldest one's submit time, and the jobs
    completed within the window."""

    pipeline: str
    lane: str
    queued: int
    oldest_queued_at: datetime | None
    completed: int


@dataclass(frozen=True)
class QueueSignals:
    at: datetime
    window_s: float  # the window ``completed`` counts over
    lanes: tuple[LaneSignals, ...]
    running: dict[str, int]  # running jobs per pipeline (every pipeline named, 0 if none)


@dataclass(frozen=True)
class LanePicture:
    """One pipeline's lane as the fair claim sees it, at ``at``: the tenants waiting
    (ready jobs, the oldest one), their weights and passes, the lane's clock, the
    interactive jobs a bulk job waits behind (``before``), the claims of the running
    attempts, and the pipeline's recent pace (``StandingRepository.lane``)."""

    pipeline: str
    lane: str
    at: datetime
    vtime: float
    before: int
    waiting: dict[str, int]
    oldest: dict[str, datetime]
    weights: dict[str, float]
    passes: dict[str, float]
    running: tuple[datetime, ...]
    duration_s: float | None  # claim to completion, median of recent attempts
    interval_s: float | None  # a busy worker's claim to its next claim


@dataclass(frozen=True)
class QueueStanding:
    """A queued job's place and estimates; the estimates are None with a ``reason``
    when there is nothing to estimate from."""

    position: int
    start_at: datetime | None = None
    completed_at: datetime | None = None
    reason: str | None = None
