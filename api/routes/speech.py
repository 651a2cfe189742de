"""``POST /v1/audio/speech``: OpenAI-compatible; waits for the job unless told not to."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Header
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response

from core.errors import Conflict, InvalidRequest, RenderFailed, clip
from core.jobs import JobKind, JobStatus
from pipelines import SpeechRequest, resolve_model

from ..deps import Services, services, tenant_id
from ..guard import GuardedRoute
from ..schemas import SpeechCreate
from ..service import job_public, parse_prefer, submit, wait_for
from .webhooks import job_webhook

router = APIRouter(route_class=GuardedRoute)


def accepted(svc: Services, job, applied: str | None) -> JSONResponse:
    headers = {"Location": f"/v1/jobs/{job.id}", "X-Job-Id": job.id}
    if applied:
        headers["Preference-Applied"] = applied
    return JSONResponse(job_public(svc, job).model_dump(), status_code=202, headers=headers)


@router.post("/v1/audio/speech", responses={202: {"description": "Job accepted"}})
async def create_speech(body: SpeechCreate, svc: Services = Depends(services),
                        tenant: str = Depends(tenant_id),
                        prefer: str | None = Header(default=None),
                        idempotency_key: str | None = Header(default=None)) -> Response:
    spec = resolve_model(body.model, svc.settings.pipelines, svc.settings.model_aliases)
    if spec.kind is not JobKind.SPEECH:
        raise InvalidRequest(f"model '{clip(body.model)}' does not generate speech",
                             param="model", code="unsupported_model")
    fields = body.model_dump(exclude_none=True, exclude={
        "model", "metadata", "stream_format", "webhook_url", "webhook_events"})
    spec.validate_speech(SpeechRequest.from_dict(fields))
    webhook = await run_in_threadpool(job_webhook, svc, body.webhook_url, body.webhook_events,
                                      JobKind.SPEECH)
    job = await run_in_threadpool(submit, svc, tenant=tenant, spec=spec, model=body.model,
                                  request=fields, metadata=body.metadata,
                                  idempotency_key=idempotency_key, webhook=webhook)
    wait = parse_prefer(prefer, svc.settings.sync_wait_default_s, svc.settings.sync_wait_max_s)
    if wait is None:
        return accepted(svc, job, "respond-async")
    job = await wait_for(svc, job, wait)
    if job.status is JobStatus.COMPLETED:
        out = job.outputs[0]
        data = await run_in_threadpool(svc.store.get, out.key)
        return Response(content=data, media_type=out.content_type, headers={"X-Job-Id": job.id})
    if job.status is JobStatus.FAILED:
        raise RenderFailed(f"job {job.id} failed: {job.error_message}",
                           code=job.error_code or "job_failed")
    if job.status is JobStatus.CANCELLED:
        raise Conflict(f"job {job.id} was cancelled", code="job_cancelled")
    return accepted(svc, job, f"wait={int(wait)}" if prefer else None)
