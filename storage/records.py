"""Typed records the repositories hand out, so no ORM object or Session leaves storage/."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from core.jobs import JobKind, JobStatus


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
    dispatch_token: str | None = None
    expires_at: datetime | None = None  # when the outputs expire (set at completion)
    outputs_deleted_at: datetime | None = None


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
