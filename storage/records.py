"""Typed records the repositories hand out, so no ORM object or Session leaves storage/."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from core.batches import BatchStatus
from core.jobs import JobKind, JobStatus

# An output row's variant: the output itself, or one of a video's previews (made in
# finalize from the stored video, stored and verified as the video is).
MAIN = "main"
PREVIEWS = ("thumbnail", "spritesheet")


@dataclass(frozen=True)
class OutputRecord:
    index: int
    key: str
    content_type: str
    bytes: int
    sha256: str
    duration_s: float | None = None
    sample_rate: int | None = None
    channels: int | None = None
    width: int | None = None
    height: int | None = None
    fps: float | None = None
    frames: int | None = None
    variant: str = MAIN  # or a preview of output ``index`` (PREVIEWS)


@dataclass(frozen=True)
class JobRecord:
    id: str
    tenant_id: str
    kind: JobKind
    model: str
    pipeline: str
    status: JobStatus
    progress: int
    request: dict[str, Any]
    metadata: dict[str, Any] | None
    attempts: int
    max_attempts: int
    error_code: str | None
    error_message: str | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    lease_expires_at: datetime | None
    idempotency_key: str | None = None
    outputs: tuple[OutputRecord, ...] = field(default_factory=tuple)
    previews: tuple[OutputRecord, ...] = field(default_factory=tuple)  # a video's previews
    dispatch_token: str | None = None
    expires_at: datetime | None = None  # when the outputs expire (set at completion)
    outputs_deleted_at: datetime | None = None
    start_by: datetime | None = None  # the caller's start deadline
    max_run_s: float | None = None  # the caller's maximum run time per attempt
    usage: UsageRecord | None = None  # once the job has ended
    batch_id: str | None = None  # a batch's job: the bulk lane
    ready_at: datetime | None = None  # a retry's backoff: not claimed before then


@dataclass(frozen=True)
class UsageRecord:
    """What a job (or, summed, a batch or a bucket of them) cost. ``render_s`` is every
    attempt's worker wall time in the pipeline; ``failed_render_s`` is the part spent in
    attempts that produced nothing (retried, failed, timed out, cancelled), reported
    apart so it is never billed as if it were output."""

    render_s: float = 0.0
    failed_render_s: float = 0.0
    attempts: int = 0
    device: str | None = None
    characters: int = 0
    audio_s: float = 0.0
    video_s: float = 0.0
    frames: int = 0
    bytes: int = 0
    jobs: int = 1
    completed: int = 1  # of ``jobs``, those that ended ``completed``


@dataclass(frozen=True)
class Deadlines:
    """A job's start deadline and maximum run time per attempt (either may be None)."""

    start_by: datetime | None = None
    max_run_s: float | None = None


@dataclass(frozen=True)
class NewJob:
    tenant_id: str
    kind: JobKind
    model: str
    pipeline: str
    queue: str
    request: dict[str, Any]
    metadata: dict[str, Any] | None
    max_attempts: int
    idempotency_key: str | None = None
    webhook: JobWebhookRequest | None = None
    lane: str = "interactive"  # which quotas admit it (storage.repositories.quotas)
    start_by: datetime | None = None
    max_run_s: float | None = None
    # Chosen by a caller that must know the id before the job exists (a synchronous wait
    # subscribes to its notices first); else minted at insert (``new_job_id``).
    id: str | None = None


@dataclass(frozen=True)
class OutboxRecord:
    id: int
    topic: str
    job_id: str
    queue: str
    payload: dict[str, Any]
    available_at: datetime

    @property
    def token(self) -> str | None:
        """The job's dispatch token this message carries (None on messages that predate
        tokens)."""
        return self.payload.get("token")

# ---- webhooks ----------------------------------------------------------------------

@dataclass(frozen=True)
class JobWebhookRequest:
    """A per-job callback URL (already SSRF-checked) and the events it wants."""

    url: str
    event_types: tuple[str, ...]


@dataclass(frozen=True)
class EndpointRecord:
    id: str
    tenant_id: str
    name: str
    url: str
    event_types: tuple[str, ...]
    created_at: datetime
    updated_at: datetime
    disabled_at: datetime | None
    secret_hint: str


@dataclass(frozen=True)
class SecretRecord:
    secret: str
    created_at: datetime
    previous_secret: str | None = None
    previous_expires_at: datetime | None = None

    def active(self, now: datetime) -> tuple[str, ...]:
        """The secrets to sign with now: the current one, and the previous one while a
        rotation keeps it valid."""
        if self.previous_secret and self.previous_expires_at and self.previous_expires_at > now:
            return (self.secret, self.previous_secret)
        return (self.secret,)


@dataclass(frozen=True)
class DeliveryWork:
    """What a delivery task needs for one attempt (the lock on it is ours)."""

    id: int
    token: str
    event_id: str
    event_type: str
    event_created_at: datetime
    job_id: str
    tenant_id: str
    endpoint_id: str | None
    url: str
    attempts: int
    created_at: datetime


@dataclass(frozen=True)
class AttemptRecord:
    attempted_at: datetime
    url_host: str
    status_code: int | None
    error: str | None
    duration_ms: int
    next_attempt_at: datetime | None


@dataclass(frozen=True)
class DeliveryLogRecord:
    id: int
    event_id: str
    event_type: str
    endpoint_id: str | None
    status: str
    next_attempt_at: datetime | None
    created_at: datetime
    attempts: tuple[AttemptRecord, ...]
    job_id: str | None = None  # the job (or batch) the event reports
    tenant_id: str | None = None


@dataclass(frozen=True)
class KeyRecord:
    """An API key as an operator sees it: never the key itself."""

    prefix: str
    tenant: str
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None


@dataclass(frozen=True)
class JobAttemptRecord:
    """One attempt of a job, for its timeline."""

    attempt: int
    worker_id: str | None
    claimed_at: datetime
    ended_at: datetime | None
    outcome: str | None  # completed, failed, retried, cancelled; None while it runs
    error_code: str | None
    error_message: str | None
    render_s: float | None = None  # the worker's wall time in the pipeline
    device: str | None = None


@dataclass(frozen=True)
class JobFilter:
    """What a list of jobs may be narrowed to (all optional). ``tenant_id`` None is
    every tenant: only an operator's console asks for that."""

    tenant_id: str | None
    status: JobStatus | None = None
    kind: JobKind | None = None
    model: str | None = None
    batch_id: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None


@dataclass(frozen=True)
class SessionRecord:
    """A signed-in console session: whose key, which tenant, and its CSRF token."""

    tenant_id: str
    tenant_name: str
    operator: bool
    key_prefix: str
    csrf: str


# ---- files and batches ---------------------------------------------------------------

@dataclass(frozen=True)
class FileRecord:
    id: str
    tenant_id: str
    purpose: str
    filename: str
    bytes: int
    key: str
    created_at: datetime
    expires_at: datetime | None = None
    expired_at: datetime | None = None  # the bytes were deleted; the record stays

    def expired(self, now: datetime) -> bool:
        """Past its expiry, whether or not maintenance has deleted the bytes yet."""
        return self.expired_at is not None or (
            self.expires_at is not None and self.expires_at <= now)


@dataclass(frozen=True)
class JobObjects:
    """What the orphan sweep may keep under one job's prefix: a finished job's ``keys``;
    while it is queued or running (``keys`` None) anything an attempt from
    ``first_live_attempt`` on wrote, since earlier attempts are over (their lease reaped)."""

    keys: frozenset[str] | None
    first_live_attempt: int = 0


@dataclass(frozen=True)
class NewFile:
    """A file whose bytes are already in the object store under ``key``."""

    tenant_id: str
    purpose: str
    filename: str
    bytes: int
    key: str
    id: str = ""  # chosen by the repository unless given
    expires_after_s: int | None = None  # from its creation; None: never


@dataclass(frozen=True)
class RequestCounts:
    total: int = 0
    completed: int = 0
    failed: int = 0


@dataclass(frozen=True)
class BatchRecord:
    id: str
    tenant_id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: BatchStatus
    metadata: dict[str, str] | None
    errors: list[dict[str, Any]] | None
    output_file_id: str | None
    error_file_id: str | None
    counts: RequestCounts
    created_at: datetime
    expires_at: datetime
    in_progress_at: datetime | None = None
    finalizing_at: datetime | None = None
    completed_at: datetime | None = None
    failed_at: datetime | None = None
    expired_at: datetime | None = None
    cancelling_at: datetime | None = None
    cancelled_at: datetime | None = None
    output_expires_after_s: int | None = None
    usage: UsageRecord | None = None  # the sum over its finished jobs


@dataclass(frozen=True)
class LineRejected:
    """A batch line whose body the endpoint refuses: the status and body it answers."""

    status_code: int
    body: dict[str, Any]


@dataclass(frozen=True)
class BatchLine:
    """One checked line of a batch input: a job to create, or the endpoint's refusal."""

    index: int
    custom_id: str
    job: NewJob | None = None
    rejected: LineRejected | None = None


@dataclass(frozen=True)
class RejectionRecord:
    line: int
    custom_id: str
    status_code: int
    body: dict[str, Any]


# ---- the fleet -----------------------------------------------------------------------

@dataclass(frozen=True)
class WorkerBeat:
    """What a process of the fleet says about itself in each heartbeat."""

    id: str
    role: str  # "worker" (renders) or "maintenance"
    host: str
    pid: int
    pipelines: tuple[str, ...]
    device: str | None
    version: str
    started_at: datetime
    job_id: str | None = None  # the job it is generating, if any
    draining: bool = False  # told to stop: it claims nothing more


@dataclass(frozen=True)
class WorkerRecord:
    id: str
    role: str
    host: str
    pid: int
    pipelines: tuple[str, ...]
    device: str | None
    version: str
    started_at: datetime
    heartbeat_at: datetime
    expires_at: datetime
    job_id: str | None
    draining_at: datetime | None

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
