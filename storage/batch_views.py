"""The public file and batch objects (OpenAI's shapes): what ``GET`` returns, shared by the
API's routes and the ``batch.*`` webhook events, so both present the same thing."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel

from .records import BatchRecord, FileRecord
from .usage_views import BatchTokenUsage, UsagePublic, token_usage, usage_view
from .views import timestamp


class FilePublic(BaseModel):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    expires_at: int | None
    filename: str
    purpose: str
    status: Literal["processed", "expired"] = "processed"


class BatchError(BaseModel):
    code: str
    message: str
    line: int | None = None
    param: str | None = None


class BatchErrors(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchError]


class RequestCountsPublic(BaseModel):
    total: int
    completed: int
    failed: int


class BatchPublic(BaseModel):
    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    errors: BatchErrors | None
    input_file_id: str
    completion_window: str
    status: str
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    in_progress_at: int | None
    expires_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: RequestCountsPublic
    metadata: dict[str, str] | None
    usage: BatchTokenUsage  # OpenAI's token counts, in this service's units
    render_usage: UsagePublic | None = None  # the sum over its finished jobs


def file_view(record: FileRecord) -> FilePublic:
    """``expired`` once the file is past ``expires_at`` (its bytes deleted, or about to be)."""
    expired = record.expired(datetime.now(UTC))
    return FilePublic(id=record.id, bytes=record.bytes, created_at=timestamp(record.created_at),
                      expires_at=timestamp(record.expires_at), filename=record.filename,
                      purpose=record.purpose, status="expired" if expired else "processed")


def batch_view(record: BatchRecord) -> BatchPublic:
    errors = (BatchErrors(data=[BatchError(**e) for e in record.errors])
              if record.errors else None)
    stamps = {name: timestamp(getattr(record, name)) for name in (
        "created_at", "in_progress_at", "expires_at", "finalizing_at", "completed_at",
        "failed_at", "expired_at", "cancelling_at", "cancelled_at")}
    counts = record.counts
    return BatchPublic(
        id=record.id, endpoint=record.endpoint, errors=errors,
        input_file_id=record.input_file_id, completion_window=record.completion_window,
        status=record.status.value, output_file_id=record.output_file_id,
        error_file_id=record.error_file_id, metadata=record.metadata,
        request_counts=RequestCountsPublic(total=counts.total, completed=counts.completed,
                                           failed=counts.failed),
        usage=token_usage(record.usage), render_usage=usage_view(record.usage), **stamps)
