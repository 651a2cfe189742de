"""``GET /v1/jobs/{id}/events`` and ``GET /v1/videos/{id}/events``: Server-Sent Events.

Each event's data is the object ``GET`` of the same resource returns (signed URLs
included): ``status`` when the status changes, ``progress`` while it runs, and ``output``
once it completed; the stream ends after the terminal state. While the job is queued, a
``queue`` event (no id) carries its ``queue_position`` and estimates whenever they
change. A client that reconnects with ``Last-Event-ID`` gets what it has not seen; one
that connects after the end gets the final state at once.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Header
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

from core.jobs import JobKind
from storage.records import JobRecord
from storage.views import job_view, video_view

from ..deps import Services, services, tenant_id
from ..guard import GuardedRoute
from ..live import SSE_HEADERS, job_events, parse_last_event_id
from ..service import get_job

router = APIRouter(route_class=GuardedRoute)

SSE_RESPONSE = {200: {"description": "Server-Sent Events until the job ends",
                      "content": {"text/event-stream": {}}}}


async def _stream(svc: Services, tenant: str, job_id: str, last_event_id: str | None,
                  kind: JobKind | None) -> StreamingResponse:
    last = parse_last_event_id(last_event_id)
    job = await run_in_threadpool(get_job, svc, tenant, job_id, kind)
    slot = svc.live.slot(tenant)  # one of the tenant's open streams (a 429 if none left)
    view = video_view if kind is JobKind.VIDEO else job_view

    def present(j: JobRecord):
        return view(j, svc.store, svc.settings.signed_url_ttl_s)
    return StreamingResponse(job_events(svc, job, last, present, slot),
                             media_type="text/event-stream", headers=SSE_HEADERS)


@router.get("/v1/jobs/{job_id}/events", response_class=StreamingResponse,
            responses=SSE_RESPONSE)
async def job_event_stream(job_id: str, svc: Services = Depends(services),
                           tenant: str = Depends(tenant_id),
                           last_event_id: str | None = Header(default=None, max_length=32)
                           ) -> StreamingResponse:
    return await _stream(svc, tenant, job_id, last_event_id, None)


@router.get("/v1/videos/{video_id}/events", response_class=StreamingResponse,
            responses=SSE_RESPONSE)
async def video_event_stream(video_id: str, svc: Services = Depends(services),
                             tenant: str = Depends(tenant_id),
                             last_event_id: str | None = Header(default=None, max_length=32)
                             ) -> StreamingResponse:
    return await _stream(svc, tenant, video_id, last_event_id, JobKind.VIDEO)
