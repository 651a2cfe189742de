"""``/v1/videos``: OpenAI Videos-compatible create, retrieve, list, delete, content."""

from __future__ import annotations

import hashlib
import secrets

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException

from core.errors import InvalidRequest, clip
from core.jobs import JobKind
from core.settings import Settings
from pipelines import PipelineSpec, VideoRequest, all_specs, resolve_model
from storage.records import MAIN, PREVIEWS
from storage.views import video_view

from ..deadlines import deadlines
from ..deps import Services, services, tenant_id
from ..guard import GuardedRoute
from ..schemas import VideoCreate, VideoDeleted, VideoList, VideoPublic, video_request_body
from ..service import (
    Page,
    get_job,
    list_page,
    remove_job,
    standing_of,
    status_detail,
    submit,
)
from .jobs import stream_output
from .webhooks import job_webhook

router = APIRouter(prefix="/v1/videos", route_class=GuardedRoute)

POLL_AFTER_MS = "500"
VARIANTS = {"video": MAIN, **{v: v for v in PREVIEWS}}  # OpenAI's name -> the output row's
# No file part is accepted: one is refused at its headers, before its bytes are read.
FORM_LIMITS = {"max_files": 0, "max_fields": 32}
NO_FILES = InvalidRequest("file inputs (input_reference) are not supported",
                          param="input_reference", code="unsupported_parameter")


async def read_form(request: Request) -> dict:
    try:
        form = await request.form(**FORM_LIMITS)
    except HTTPException as exc:
        if exc.status_code != 400:
            raise
        raise (NO_FILES if "files" in str(exc.detail) else InvalidRequest(
            f"invalid form: {exc.detail}")) from None
    if any(isinstance(v, UploadFile) for v in form.values()):
        raise NO_FILES
    return {k: v for k, v in form.items() if v != ""}


async def read_body(request: Request) -> dict:
    """JSON or multipart/form-data (what the OpenAI SDK sends)."""
    ctype = request.headers.get("content-type", "")
    if ctype.startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
        return await read_form(request)
    try:
        body = await request.json()
    except (ValueError, RecursionError):
        raise InvalidRequest("request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    return body


def pick_spec(settings: Settings, model: str | None) -> PipelineSpec:
    if model is None:
        spec = next((s for s in all_specs(settings.pipelines) if s.video), None)
        if spec is None:
            raise InvalidRequest("no video model is enabled here", param="model",
                                 code="model_not_found")
        return spec
    spec = resolve_model(model, settings.pipelines, settings.model_aliases)
    if spec.video is None:
        raise InvalidRequest(f"model '{clip(model)}' does not generate video", param="model",
                             code="unsupported_model")
    return spec


def video_request(spec: PipelineSpec, body: VideoCreate) -> dict:
    lim = spec.video
    if len(body.prompt) > spec.max_input_chars:
        raise InvalidRequest(f"prompt is {len(body.prompt)} characters; at most "
                             f"{spec.max_input_chars}", param="prompt", code="input_too_long")
    fps = body.fps if body.fps is not None else lim.default_fps
    if fps != round(fps):
        raise InvalidRequest("fps must be a whole number", param="fps")
    request = {
        "prompt": body.prompt,
        "seconds": body.seconds if body.seconds is not None else lim.default_seconds,
        "size": body.size or lim.default_size, "fps": int(fps), "n": body.n,
        "seed": body.seed, "negative_prompt": body.negative_prompt,
        "generate_audio": lim.makes_audio if body.generate_audio is None
        else body.generate_audio,
        "guidance_scale": body.guidance_scale,
    }
    spec.validate_video(VideoRequest.from_dict(request), body.model)
    return request


def draw_seed(tenant: str, idempotency_key: str | None) -> int:
    """A random seed for an unseeded job, recorded in its request so a rerun reproduces
    the clip. Under an Idempotency-Key it is derived from the key, so a retried submit
    is the same request and returns the same job."""
    if idempotency_key is None:
        return secrets.randbelow(2**31)
    digest = hashlib.sha256(f"{tenant}\0{idempotency_key}".encode()).digest()
    return int.from_bytes(digest[:4], "big") >> 1


def video_job(settings: Settings, body: VideoCreate, tenant: str, key: str | None
              ) -> tuple[PipelineSpec, str, dict]:
    """The pipeline, model and job request for a video body (an unseeded job of a
    random-seed pipeline gets its seed here), or InvalidRequest: the endpoint's contract,
    which batch lines go through too."""
    spec = pick_spec(settings, body.model)
    fields = video_request(spec, body)
    if fields["seed"] is None and spec.video.random_seed:
        fields["seed"] = draw_seed(tenant, key)
    return spec, body.model or spec.models[0], fields


def video_public(svc: Services, job) -> VideoPublic:
    return video_view(job, svc.store, svc.settings.signed_url_ttl_s, status_detail(svc, job))


@router.post("", response_model=VideoPublic, openapi_extra=video_request_body())
async def create_video(request: Request, svc: Services = Depends(services),
                       tenant: str = Depends(tenant_id),
                       idempotency_key: str | None = Header(default=None),
                       cancel_after: str | None = Header(default=None, description=(
                           "The maximum run time (as `max_run_s`): `30s`, `5m`, `1h30m`"))
                       ) -> JSONResponse:
    raw = await read_body(request)
    try:
        body = VideoCreate.model_validate(raw)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from None
    spec, model, fields = video_job(svc.settings, body, tenant, idempotency_key)
    deadline = deadlines(svc.settings, spec, body.start_within_s, body.max_run_s, cancel_after)
    webhook = await run_in_threadpool(job_webhook, svc, body.webhook_url, body.webhook_events,
                                      JobKind.VIDEO)
    job = await run_in_threadpool(submit, svc, tenant=tenant, spec=spec,
                                  model=model, request=fields,
                                  metadata=body.metadata, idempotency_key=idempotency_key,
                                  webhook=webhook, deadline=deadline)
    return JSONResponse(video_public(svc, job).model_dump(),
                        headers={"openai-poll-after-ms": POLL_AFTER_MS})


@router.get("", response_model=VideoList)
def list_videos(page: Page = Depends(), svc: Services = Depends(services),
                tenant: str = Depends(tenant_id)) -> VideoList:
    return VideoList(**list_page(svc, tenant, page, video_public, kind=JobKind.VIDEO))


@router.get("/{video_id}", response_model=VideoPublic)
def retrieve_video(video_id: str, svc: Services = Depends(services),
                   tenant: str = Depends(tenant_id)) -> JSONResponse:
    job = get_job(svc, tenant, video_id, JobKind.VIDEO)
    view = video_view(job, svc.store, svc.settings.signed_url_ttl_s, status_detail(svc, job),
                      standing_of(svc, job))
    return JSONResponse(view.model_dump(), headers={"openai-poll-after-ms": POLL_AFTER_MS})


@router.delete("/{video_id}", response_model=VideoDeleted)
def delete_video(video_id: str, svc: Services = Depends(services),
                 tenant: str = Depends(tenant_id)) -> VideoDeleted:
    """Cancel first if still queued or running, then remove the objects and the record."""
    job = get_job(svc, tenant, video_id, JobKind.VIDEO)
    remove_job(svc, tenant, job, JobKind.VIDEO)
    return VideoDeleted(id=job.id)


@router.get("/{video_id}/content")
def video_content(video_id: str, variant: str = Query(default="video", max_length=32),
                  index: int = Query(default=0, ge=0, le=3),
                  svc: Services = Depends(services),
                  tenant: str = Depends(tenant_id)) -> StreamingResponse:
    """The MP4 (``video``), or its ``thumbnail`` (a still) or ``spritesheet`` (a grid of
    frames), both WebP, made when the video was."""
    if variant not in VARIANTS:
        raise InvalidRequest(f"variant '{clip(variant)}' is not one of "
                             f"{', '.join(VARIANTS)}", param="variant",
                             code="unsupported_variant")
    return stream_output(svc, get_job(svc, tenant, video_id, JobKind.VIDEO), index,
                         VARIANTS[variant])
