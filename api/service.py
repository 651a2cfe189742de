"""Submit, wait and present jobs: the logic shared by the speech and job routes."""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import Query
from fastapi.concurrency import run_in_threadpool

from core.errors import Conflict, InvalidRequest, NotFound, TooManyRequests, clip
from core.jobs import JobKind, JobStatus, is_job_id
from core.text import refused_character
from pipelines import PipelineSpec
from storage import eta
from storage.records import Deadlines, JobRecord, JobWebhookRequest, NewJob, QueueStanding
from storage.views import DEADLINE_EXCEEDED, WAITING_FOR_A_WORKER, JobPublic, job_view

from .deps import Services
from .metrics import JOBS_SUBMITTED, PUBLISH_DEFERRED

log = logging.getLogger(__name__)

_WAIT = re.compile(r"(?:^|[,;\s])wait\s*=\s*(\d+(?:\.\d+)?)", re.I)


def submit(svc: Services, *, tenant: str, spec: PipelineSpec, model: str, request: dict,
           metadata: dict | None, idempotency_key: str | None,
           webhook: JobWebhookRequest | None = None,
           deadline: Deadlines | None = None, job_id: str | None = None) -> JobRecord:
    """Admit, insert the job with its outbox message, then publish: in the background
    where the app has a submitter, so a frozen broker holds no answer."""
    if idempotency_key is not None and (not 1 <= len(idempotency_key) <= 255
                                        or refused_character(idempotency_key)):
        raise InvalidRequest("Idempotency-Key must be 1 to 255 characters, none of them a "
                             "control character", param="Idempotency-Key")
    throttle(svc, tenant)
    new = NewJob(tenant_id=tenant, kind=spec.kind, model=model, pipeline=spec.name,
                 queue=spec.queue, request=request, metadata=metadata,
                 max_attempts=svc.settings.max_attempts, idempotency_key=idempotency_key,
                 webhook=webhook, id=job_id, **deadline_fields(deadline))
    job, msg = svc.jobs.create(new)  # a database outage is a 503 (api/errors.py)
    if msg is None and (job.kind, job.pipeline, job.model, job.request, job.metadata) != (
            spec.kind, spec.name, model, request, metadata):
        raise Conflict("Idempotency-Key was already used for a different request",
                       param="Idempotency-Key", code="idempotency_key_reused")
    if msg is not None:
        JOBS_SUBMITTED.labels(spec.kind.value, model).inc()
        if svc.submitter is not None:  # published in the background (api/submitter.py)
            svc.submitter.publish_later(svc, [msg])
            return job
        try:
            svc.publish(msg)
            svc.outbox.mark_published([msg.id])
        except Exception:  # the relay publishes it later; the job is already safe
            PUBLISH_DEFERRED.inc()
            log.warning("publish failed for %s; left to the outbox relay", job.id,
                        extra={"job_id": job.id})
    return job


def deadline_fields(deadline: Deadlines | None) -> dict:
    """NewJob's deadline fields."""
    if deadline is None:
        return {}
    return {"start_by": deadline.start_by, "max_run_s": deadline.max_run_s}


def deadline_ended(job: JobRecord) -> Conflict | None:
    """The answer for a waited-on job that a deadline ended (``expired``, or cancelled
    with ``deadline_exceeded``): a 409 with the reason as the code; None otherwise."""
    if job.status is JobStatus.EXPIRED or (job.status is JobStatus.CANCELLED
                                           and job.error_code == DEADLINE_EXCEEDED):
        return Conflict(f"job {job.id} ended {job.status.value}: {job.error_message}",
                        code=job.error_code)
    return None


def throttle(svc: Services, tenant: str) -> None:
    """The tenant's submit rate limit (token bucket)."""
    wait = svc.limiter.wait_s(tenant)
    if wait > 0:
        raise TooManyRequests("too many submits per second for this tenant; slow down",
                              code="rate_limit_exceeded", retry_after_s=math.ceil(wait))


def parse_prefer(header: str | None, default_s: float, max_s: float) -> float | None:
    """Seconds to wait for completion, or None for ``respond-async``."""
    if header and "respond-async" in header.lower():
        return None
    match = _WAIT.search(header or "")
    wait = float(match.group(1)) if match else default_s
    return min(wait, max_s)


def get_job(svc: Services, tenant: str | None, job_id: str, kind: JobKind | None = None
            ) -> JobRecord:
    """The tenant's job (``tenant`` None, every tenant's: an operator's console)."""
    job = svc.jobs.get(job_id, tenant) if is_job_id(job_id) else None
    if job is None or (kind is not None and job.kind is not kind):
        raise not_found(job_id, kind)
    return job


def found(job: JobRecord | None, job_id: str, kind: JobKind | None = None) -> JobRecord:
    """A row read again may be gone (a concurrent DELETE): that is a 404 too."""
    if job is None:
        raise not_found(job_id, kind)
    return job


def not_found(job_id: str, kind: JobKind | None = None) -> NotFound:
    """A well-formed id is quoted whole (ids are not free text); anything else is cut."""
    shown = job_id if is_job_id(job_id) else clip(job_id)
    noun = "video" if kind is JobKind.VIDEO else "job"
    return NotFound(f"no {noun} with id '{shown}'", param="id")


def remove_job(svc: Services, tenant: str, job: JobRecord, kind: JobKind | None = None) -> None:
    """Cancel first if still queued or running, then remove the objects and the record
    (``DELETE /v1/videos/{id}`` and ``DELETE /v1/jobs/{id}``). Objects a running worker
    uploads after this are its own to delete, or the orphan sweep's."""
    if not job.status.terminal:
        job = found(svc.jobs.cancel(job.id, tenant), job.id, kind)
        svc.live.notify(job.id)
    keys = {o.key for o in job.outputs} | set(svc.store.list_keys(f"{job.tenant_id}/{job.id}/"))
    svc.store.delete(sorted(keys))
    if not svc.jobs.delete(job.id, tenant):
        raise not_found(job.id, kind)


def job_public(svc: Services, job: JobRecord) -> JobPublic:
    return job_view(job, svc.store, svc.settings.signed_url_ttl_s, status_detail(svc, job))


def one_job_public(svc: Services, job: JobRecord) -> JobPublic:
    """One job as ``GET`` shows it: with its queue position and estimates (a list page
    leaves those to each job's own ``GET``)."""
    standing = standing_of(svc, job)
    return job_view(job, svc.store, svc.settings.signed_url_ttl_s,
                    status_detail(svc, job, standing), standing)


def standing_of(svc: Services, job: JobRecord) -> QueueStanding | None:
    return svc.standings.of(job) if svc.standings is not None else None


def status_detail(svc: Services, job: JobRecord,
                  standing: QueueStanding | None = None) -> str | None:
    """Why a queued job waits. Where its standing was read (its own GET), from the same
    look at the registry: a stale view refreshed between two looks must not make one body
    say "no live worker" in the estimate's reason and nothing in ``status_detail``."""
    if standing is not None and job.status is JobStatus.QUEUED:
        if standing.reason == eta.NO_LIVE_WORKER:
            return WAITING_FOR_A_WORKER
        if standing.reason in (None, eta.NO_RECENT_THROUGHPUT):  # a live worker counted
            return None
    return svc.fleet.detail(job) if svc.fleet is not None else None


@dataclass
class Page:
    """Cursor pagination parameters, shared by every list route."""

    after: str | None = Query(default=None, max_length=64)
    limit: int = Query(default=20, ge=1, le=100)
    order: Literal["asc", "desc"] = Query(default="desc")


def list_page(svc: Services, tenant: str, page: Page, present: Callable[[Services, Any], Any],
              **filters: Any) -> dict:
    if page.after is not None and not is_job_id(page.after):
        raise InvalidRequest(f"'after' is not a job id (got '{clip(page.after)}')",
                             param="after", code="invalid_cursor")
    jobs, has_more = svc.jobs.list(tenant, after=page.after, limit=page.limit,
                                   order=page.order, **filters)
    data = [present(svc, j) for j in jobs]
    return {"data": data, "first_id": data[0].id if data else None,
            "last_id": data[-1].id if data else None, "has_more": has_more}


async def submit_job(svc: Services, *, tenant: str, spec: PipelineSpec, model: str, request: dict,
                     metadata: dict | None, idempotency_key: str | None,
                     webhook: JobWebhookRequest | None = None,
                     deadline: Deadlines | None = None, job_id: str | None = None
                     ) -> JobRecord:
    """``submit`` from the event loop: through the group commit (api/submitter.py, which
    knows nothing of this module) unless the submit carries an idempotency key or
    deadlines (or the app has no submitter)."""
    if idempotency_key is not None or deadline is not None or svc.submitter is None:
        return await run_in_threadpool(
            submit, svc, tenant=tenant, spec=spec, model=model, request=request,
            metadata=metadata, idempotency_key=idempotency_key, webhook=webhook,
            deadline=deadline, job_id=job_id)
    if getattr(svc.limiter, "blocking", True):
        await run_in_threadpool(throttle, svc, tenant)
    else:
        throttle(svc, tenant)
    new = NewJob(tenant_id=tenant, kind=spec.kind, model=model, pipeline=spec.name,
                 queue=spec.queue, request=request, metadata=metadata,
                 max_attempts=svc.settings.max_attempts, webhook=webhook, id=job_id)
    return await svc.submitter.submit(svc, new)

