"""``POST /v1/audio/speech``: OpenAI-compatible; waits for the job unless told not to.

Once the job exists, no answer invites a resubmit (SDKs retry 5xx without an
idempotency key, which would render the same text again): a wait that a dependency
interrupts answers 202 with the job, and a result that cannot be read is an error with
``x-should-retry: false``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Depends, Header
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response

from core.errors import (
    Conflict,
    InvalidRequest,
    OmniJobsError,
    RenderFailed,
    ResultUnavailable,
    clip,
)
from core.jobs import JobKind, JobStatus
from core.settings import Settings
from pipelines import PipelineSpec, SpeechRequest, resolve_model
from storage.bus import Result
from storage.records import JobRecord
from storage.repositories.submits import new_job_id

from ..deadlines import NAMES as DEADLINES
from ..deadlines import deadlines
from ..deps import Services, services, tenant_id
from ..guard import GuardedRoute
from ..live import Slot, watching
from ..schemas import SpeechCreate
from ..service import deadline_ended, job_public, parse_prefer, submit_job
from ..speech_stream import check_streamable, stream_speech
from .webhooks import job_webhook

log = logging.getLogger(__name__)
router = APIRouter(route_class=GuardedRoute)


def speech_job(settings: Settings, body: SpeechCreate) -> tuple[PipelineSpec, dict]:
    """The pipeline and the job's request for a speech body, or InvalidRequest: the
    endpoint's contract, which batch lines go through too."""
    spec = resolve_model(body.model, settings.pipelines, settings.model_aliases)
    if spec.kind is not JobKind.SPEECH:
        raise InvalidRequest(f"model '{clip(body.model)}' does not generate speech",
                             param="model", code="unsupported_model")
    fields = body.model_dump(exclude_none=True, exclude={
        "model", "metadata", "stream_format", "webhook_url", "webhook_events",
        "cancel_on_disconnect", *DEADLINES})
    spec.validate_speech(SpeechRequest.from_dict(fields), body.model)
    return spec, fields


def accepted(svc: Services, job: JobRecord, applied: str | None) -> Response:
    headers = {"Location": f"/v1/jobs/{job.id}", "X-Job-Id": job.id}
    if applied:
        headers["Preference-Applied"] = applied
    # pydantic's own JSON (in Rust): no dict copy, no json.dumps
    return Response(job_public(svc, job).model_dump_json(), status_code=202,
                    headers=headers, media_type="application/json")


async def result(svc: Services, job: JobRecord, applied: str | None) -> Response:
    """The waited-on job's answer: its bytes, its failure, or 202 while it runs."""
    if job.status is JobStatus.COMPLETED:
        out = job.outputs[0]
        try:
            data = await run_in_threadpool(svc.store.get, out.key)
        except Exception as exc:
            raise ResultUnavailable(
                f"job {job.id} completed but its result cannot be read right now; fetch it "
                f"with GET /v1/jobs/{job.id}/content") from exc
        return Response(content=data, media_type=out.content_type, headers={"X-Job-Id": job.id})
    if (ended := deadline_ended(job)) is not None:
        raise ended
    if job.status is JobStatus.FAILED:
        raise RenderFailed(f"job {job.id} failed: {job.error_message}",
                           code=job.error_code or "job_failed")
    if job.status is JobStatus.CANCELLED:
        raise Conflict(f"job {job.id} was cancelled", code="job_cancelled")
    return accepted(svc, job, applied)


@router.post("/v1/audio/speech", responses={202: {"description": "Job accepted"}})
async def create_speech(body: SpeechCreate, svc: Services = Depends(services),
                        tenant: str = Depends(tenant_id),
                        prefer: str | None = Header(default=None),
                        idempotency_key: str | None = Header(default=None),
                        cancel_after: str | None = Header(default=None, description=(
                            "The maximum run time (as `max_run_s`): `30s`, `5m`, `1h30m`"))
                        ) -> Response:
    spec, fields = speech_job(svc.settings, body)
    deadline = deadlines(svc.settings, spec, body.start_within_s, body.max_run_s, cancel_after)
    if body.stream_format is not None:
        check_streamable(svc, body.response_format)
    wait = parse_prefer(prefer, svc.settings.sync_wait_default_s, svc.settings.sync_wait_max_s)
    # A stream or a wait holds one of the tenant's slots: a 429 before anything is stored.
    slot = svc.live.slot(tenant) if body.stream_format is not None or wait is not None else None
    hook = (body.webhook_url, body.webhook_events, JobKind.SPEECH)
    job_id = new_job_id(JobKind.SPEECH)
    async with contextlib.AsyncExitStack() as stack:
        waiting = (await stack.enter_async_context(watching(svc, job_id, wait))
                   if wait is not None and body.stream_format is None else None)
        try:
            webhook = (job_webhook(svc, *hook) if body.webhook_url is None  # no DNS: no hop
                       else await run_in_threadpool(job_webhook, svc, *hook))
            job = await submit_job(svc, tenant=tenant, spec=spec, model=body.model,
                                   request=fields, metadata=body.metadata,
                                   idempotency_key=idempotency_key, webhook=webhook,
                                   deadline=deadline, job_id=job_id)
        except BaseException:
            if slot is not None:
                slot.release()
            raise
        if body.stream_format is not None:
            return await streamed(svc, body, job, slot)
        if waiting is None:
            return accepted(svc, job, "respond-async")
        with slot:
            return await waited(svc, job, waiting, f"wait={int(wait)}" if prefer else None)


async def streamed(svc: Services, body: SpeechCreate, job: JobRecord, slot: Slot
                   ) -> Response:
    try:
        answer = await stream_speech(svc, job, body.response_format, body.stream_format,
                                     body.cancel_on_disconnect, slot)
    except OmniJobsError:  # the job's own answer (failed, cancelled)
        raise
    except Exception:  # the bus is down: the job goes on; never invite a resubmit
        log.warning("streaming job %s failed to start; answering 202", job.id,
                    exc_info=True, extra={"job_id": job.id})
        return accepted(svc, job, None)
    return accepted(svc, answer, None) if isinstance(answer, JobRecord) else answer


async def waited(svc: Services, job: JobRecord,
                 until_done: Callable[[JobRecord], Awaitable[JobRecord | Result]],
                 applied: str | None) -> Response:
    try:
        ended = await until_done(job)
    except Exception:  # the job exists: never answer in a way that invites a resubmit
        log.warning("waiting for job %s failed; answering 202", job.id, exc_info=True,
                    extra={"job_id": job.id})
        return accepted(svc, job, None)
    if isinstance(ended, Result):  # handed over with the completion: the stored bytes
        return Response(content=ended.data, media_type=ended.content_type,
                        headers={"X-Job-Id": job.id})
    return await result(svc, ended, applied)
