"""``/v1/jobs``: the job-native view of every kind of job."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Depends, Query
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from core.errors import Conflict, NotFound, OutputExpired
from core.jobs import JobKind, JobStatus
from storage.records import MAIN, JobRecord, OutputRecord
from storage.views import outputs_expired

from ..deps import Services, services, tenant_id
from ..guard import GuardedRoute
from ..schemas import JobList, JobPublic
from ..service import Page, found, get_job, job_public, list_page, one_job_public, remove_job

router = APIRouter(prefix="/v1/jobs", route_class=GuardedRoute)


class JobDeleted(BaseModel):
    id: str
    object: Literal["job.deleted"] = "job.deleted"
    deleted: bool = True


@router.get("", response_model=JobList)
def list_jobs(page: Page = Depends(), status: JobStatus | None = None,
              kind: JobKind | None = None, svc: Services = Depends(services),
              tenant: str = Depends(tenant_id)) -> JobList:
    return JobList(**list_page(svc, tenant, page, job_public, status=status, kind=kind))


@router.get("/{job_id}", response_model=JobPublic)
def retrieve_job(job_id: str, svc: Services = Depends(services),
                 tenant: str = Depends(tenant_id)) -> JobPublic:
    return one_job_public(svc, get_job(svc, tenant, job_id))


@router.post("/{job_id}/cancel", response_model=JobPublic)
def cancel_job(job_id: str, svc: Services = Depends(services),
               tenant: str = Depends(tenant_id)) -> JobPublic:
    """Only a queued or running job can be cancelled; one that has ended (or ends while
    this runs) is a 409 naming its status, so a caller never mistakes it for a cancel."""
    not_cancellable(get_job(svc, tenant, job_id))
    job = found(svc.jobs.cancel(job_id, tenant), job_id)
    svc.live.notify(job_id)
    if job.status is not JobStatus.CANCELLED:
        not_cancellable(job)
    return job_public(svc, job)


@router.delete("/{job_id}", response_model=JobDeleted)
def delete_job(job_id: str, svc: Services = Depends(services),
               tenant: str = Depends(tenant_id)) -> JobDeleted:
    """Any kind of job: cancelled first if it is still queued or running, then its
    outputs and its record are removed (as ``DELETE /v1/videos/{id}`` does)."""
    remove_job(svc, tenant, get_job(svc, tenant, job_id))
    return JobDeleted(id=job_id)


def not_cancellable(job: JobRecord) -> None:
    if job.status.terminal:
        raise Conflict(f"job {job.id} is {job.status.value}; only a queued or running job "
                       "can be cancelled", code="job_not_cancellable")


def output_of(job: JobRecord, index: int, variant: str = MAIN) -> OutputRecord:
    """Output ``index`` (or its preview ``variant``) of a completed job whose outputs
    have not expired."""
    if job.status is not JobStatus.COMPLETED:
        raise Conflict(f"job {job.id} is {job.status.value}; content exists once it is "
                       "completed", code="job_not_completed")
    rows = job.outputs if variant == MAIN else job.previews
    out = next((o for o in rows if o.index == index and o.variant == variant), None)
    if out is None:
        what = f"output {index}" if variant == MAIN else f"{variant} of output {index}"
        raise NotFound(f"job {job.id} has no {what}", param="index")
    if outputs_expired(job):
        raise OutputExpired(f"the outputs of job {job.id} have expired and were deleted")
    return out


def stream_output(svc: Services, job, index: int, variant: str = MAIN) -> StreamingResponse:
    out = output_of(job, index, variant)
    try:
        chunks = svc.store.stream(out.key)
    except NotFound:  # deleted since the job was read: retention (410) or a DELETE (404)
        if outputs_expired(job):
            raise OutputExpired(f"the outputs of job {job.id} have expired and were "
                                "deleted") from None
        raise NotFound(f"the output {index} of job {job.id} no longer exists",
                       param="index") from None
    return StreamingResponse(chunks, media_type=out.content_type,
                             headers={"Content-Length": str(out.bytes),
                                      "X-Content-SHA256": out.sha256})


@router.get("/{job_id}/content")
def job_content(job_id: str, index: int = Query(default=0, ge=0, le=64),
                svc: Services = Depends(services),
                tenant: str = Depends(tenant_id)) -> StreamingResponse:
    return stream_output(svc, get_job(svc, tenant, job_id), index)
