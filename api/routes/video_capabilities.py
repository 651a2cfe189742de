"""The openai SDK's video calls no pipeline here can honour yet: ``remix``, ``edit``,
``extend`` and ``create_character`` answer a 400 ``unsupported_capability`` naming the
model and the capability, so a caller learns what is missing instead of meeting a 404
that reads like a wrong URL. A pipeline that gains one of them gets its route here."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool

from core.errors import InvalidRequest, NotFound, clip
from core.jobs import JobKind

from ..deps import Services, services, tenant_id
from ..guard import GuardedRoute
from ..service import get_job
from .videos import pick_spec, read_body

router = APIRouter(prefix="/v1/videos", route_class=GuardedRoute)


def unsupported(model: str, capability: str) -> InvalidRequest:
    return InvalidRequest(f"model '{clip(model)}' does not support {capability}: no pipeline "
                          "here can honour it", code="unsupported_capability")


async def referenced_model(request: Request, svc: Services, tenant: str) -> str:
    """The model of the video a body refers to (``video: {id}``, which the SDK sends as
    the form field ``video[id]``), else the deployment's default video model."""
    try:
        body = await read_body(request)
    except InvalidRequest:  # a file part, or no JSON: nothing names a video
        body = {}
    ref = body.get("video")
    video_id = ref.get("id") if isinstance(ref, dict) else body.get("video[id]")
    if isinstance(video_id, str):
        try:
            job = await run_in_threadpool(get_job, svc, tenant, video_id, JobKind.VIDEO)
            return job.model
        except NotFound:
            pass
    return pick_spec(svc.settings, None).models[0]


@router.post("/{video_id}/remix")
def remix_video(video_id: str, svc: Services = Depends(services),
                tenant: str = Depends(tenant_id)) -> None:
    raise unsupported(get_job(svc, tenant, video_id, JobKind.VIDEO).model, "remix")


@router.post("/edits")
async def edit_video(request: Request, svc: Services = Depends(services),
                     tenant: str = Depends(tenant_id)) -> None:
    raise unsupported(await referenced_model(request, svc, tenant), "edit")


@router.post("/extensions")
async def extend_video(request: Request, svc: Services = Depends(services),
                       tenant: str = Depends(tenant_id)) -> None:
    raise unsupported(await referenced_model(request, svc, tenant), "extend")


@router.post("/characters")
def create_character(svc: Services = Depends(services),
                     tenant: str = Depends(tenant_id)) -> None:
    raise unsupported(pick_spec(svc.settings, None).models[0], "create_character")

