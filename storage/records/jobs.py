"""A job's records: the job and its outputs, what it cost, the submit that makes one, the
outbox message that wakes a worker for it, its attempts, and the filters a list of jobs
takes."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from core.jobs import JobKind, JobStatus

# An output row's variant: the output itself, or one of a video's previews (made in
# finalize from the stored video, stored and verified as the video is).
MAIN = "main"
PREVIEWS = ("thumbnail", "spritesheet")


# The fields of an output record that describe it to its owner: the API's output object
# (storage/views.py's OutputPublic) is declared from them, so the two cannot drift; the
# others say where its bytes are kept and which variant it is.
OUTPUT_DESCRIPTION = ("content_type", "bytes", "sha256", "duration_s", "sample_rate",
                      "channels", "width", "height", "fps", "frames")


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
class JobWebhookRequest:
    """A per-job callback URL (already SSRF-checked) and the events it wants."""

    url: str
    event_types: tuple[str, ...]


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
class JobObjects:
    """What the orphan sweep may keep under one job's prefix: a finished job's ``keys``;
    while it is queued or running (``keys`` None) anything an attempt from
    ``first_live_attempt`` on wrote, since earlier attempts are over (their lease reaped)."""

    keys: frozenset[str] | None
    first_live_attempt: int = 0
