"""Files and batches: an uploaded file, a batch and its request counts, and the lines of
a batch input as checked (a job to create, or the endpoint's refusal)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from core.batches import BatchStatus

from .jobs import NewJob, UsageRecord


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
