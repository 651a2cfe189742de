"""``/v1/batches``: OpenAI's Batch API for ``/v1/audio/speech`` and ``/v1/videos``.

Creating a batch only records it (``validating``); the maintenance process validates the
input file, creates its jobs in the bulk lane, and finalizes it, so no API request
carries the batch's work.
"""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, ConfigDict, Field, field_validator

from core.batches import COMPLETION_WINDOWS, ENDPOINTS, BatchStatus
from core.errors import Conflict, InvalidRequest, NotFound, clip
from storage.batch_views import BatchPublic, batch_view
from storage.records import BatchRecord

from ..deps import Services, services, tenant_id
from ..guard import GuardedRoute
from ..schemas import ExpiresAfter, ListPage, check_metadata, page_of

router = APIRouter(prefix="/v1/batches", route_class=GuardedRoute)


class BatchCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input_file_id: str = Field(min_length=1, max_length=64)
    endpoint: str = Field(max_length=64)
    completion_window: str = Field(max_length=16)
    metadata: dict[str, str] | None = None
    output_expires_after: ExpiresAfter | None = Field(
        default=None, description="When the output and error files expire, from their "
        "creation (default: OMNIJOBS_FILE_TTL_S)")

    _metadata = field_validator("metadata")(check_metadata)


def get_batch(svc: Services, tenant: str | None, batch_id: str) -> BatchRecord:
    record = svc.batches.get(batch_id, tenant)
    if record is None:
        raise NotFound(f"no batch with id '{clip(batch_id)}'", param="id")
    return record


@router.post("", response_model=BatchPublic)
def create_batch(body: BatchCreate, svc: Services = Depends(services),
                 tenant: str = Depends(tenant_id)) -> BatchPublic:
    if body.endpoint not in ENDPOINTS:
        raise InvalidRequest(f"endpoint must be one of {', '.join(ENDPOINTS)} (got "
                             f"'{clip(body.endpoint)}')", param="endpoint")
    if body.completion_window not in COMPLETION_WINDOWS:
        raise InvalidRequest(f"completion_window must be one of {', '.join(COMPLETION_WINDOWS)}"
                             f" (got '{clip(body.completion_window)}')",
                             param="completion_window")
    source = svc.files.get(body.input_file_id, tenant)
    if source is None or source.purpose != "batch":
        raise InvalidRequest(f"no batch input file with id '{clip(body.input_file_id)}'",
                             param="input_file_id", code="invalid_input_file")
    if source.expired(datetime.now(UTC)):
        raise InvalidRequest(f"the input file {source.id} has expired",
                             param="input_file_id", code="invalid_input_file")
    policy = body.output_expires_after
    return batch_view(svc.batches.create(
        tenant, endpoint=body.endpoint, input_file_id=source.id,
        completion_window=body.completion_window, metadata=body.metadata,
        max_active=svc.settings.batch_max_active,
        output_expires_after_s=policy.seconds if policy else None))


@router.get("", response_model=ListPage[BatchPublic])
def list_batches(after: str | None = Query(default=None, max_length=64),
                 limit: int = Query(default=20, ge=1, le=100),
                 svc: Services = Depends(services), tenant: str = Depends(tenant_id)) -> dict:
    records, has_more = svc.batches.list(tenant, after=after, limit=limit)
    return page_of([batch_view(r) for r in records], has_more)


@router.get("/{batch_id}", response_model=BatchPublic)
def retrieve_batch(batch_id: str, svc: Services = Depends(services),
                   tenant: str = Depends(tenant_id)) -> BatchPublic:
    return batch_view(get_batch(svc, tenant, batch_id))


@router.post("/{batch_id}/cancel", response_model=BatchPublic)
def cancel_batch(batch_id: str, svc: Services = Depends(services),
                 tenant: str = Depends(tenant_id)) -> BatchPublic:
    """Queued jobs are cancelled at once, running ones stop at their next chunk; the
    batch ends ``cancelled`` with the results it had."""
    get_batch(svc, tenant, batch_id)
    record = svc.batches.cancel(batch_id, tenant)
    if record is None:
        raise NotFound(f"no batch with id '{clip(batch_id)}'", param="id")
    if record.status not in (BatchStatus.CANCELLING, BatchStatus.CANCELLED):
        raise Conflict(f"batch {record.id} is {record.status.value}; only a validating or "
                       "in_progress batch can be cancelled", code="batch_not_cancellable")
    return batch_view(record)
