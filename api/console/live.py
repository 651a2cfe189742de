"""The console's live parts, over Server-Sent Events, pushed by the same notices as the
API's job event streams (storage/bus/, api/live.py): a page opens one stream, which
re-renders its live parts when a notice says one of its jobs changed (and on the resync
timer, ``OMNIJOBS_EVENT_RESYNC_S``, which is also how new jobs reach a list), and sends
the parts whose HTML changed. The browser swaps them in; no loop polls a row.

- A list of jobs watches the jobs of its page that have not ended, with one
  subscription, and re-reads the page (one query) when any of them changes.
- A job's page watches that job and sends its status and progress, its timeline, its
  outputs once completed, and its webhook deliveries (a replay's new attempt shows up).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable

from fastapi import APIRouter, Depends
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from ..deps import Services, services
from ..live import SSE_HEADERS, sse, watch_bus
from ..metrics import LIVE_ACTIVE
from ..service import get_job
from .pages import JobsQuery, job_parts, jobs_page, signed_in, tenant_names
from .render import ConsoleRoute, render
from .session import PATH, Viewer, viewer

router = APIRouter(prefix=PATH + "/live", route_class=ConsoleRoute, include_in_schema=False)


async def _changes(svc: Services, read: Callable[[], tuple[dict[str, str], list[str]]]
                   ) -> AsyncIterator[bytes]:
    """Send the parts that changed since the last send; then wait for a notice about a
    job of ``watched`` (as the last read found them), the resync timer or the end."""
    settings, live = svc.settings, svc.live
    deadline = time.monotonic() + settings.event_stream_max_s
    sent: dict[str, str] = {}
    yield f"retry: {int(settings.event_resync_s * 1000)}\n\n".encode()
    while (left := deadline - time.monotonic()) > 0:
        parts, watched = await run_in_threadpool(read)
        changed = {k: v for k, v in parts.items() if sent.get(k) != v}
        if changed:
            sent.update(changed)
            yield sse("parts", json.dumps(changed))
        else:
            yield b": keep-alive\n\n"
        with live.watcher.subscribe(*watched) as sub:
            for job_id in watched:
                await watch_bus(live.bus, job_id)
            await sub.wait(min(settings.event_resync_s, left))


def _stream(body: AsyncIterator[bytes]) -> StreamingResponse:
    async def counted() -> AsyncIterator[bytes]:
        with LIVE_ACTIVE.labels("console").track_inprogress():
            async for chunk in body:
                yield chunk
    return StreamingResponse(counted(), media_type="text/event-stream", headers=SSE_HEADERS)


@router.get("/jobs")
@signed_in
async def jobs_stream(query: JobsQuery = Depends(), svc: Services = Depends(services),
                      who: Viewer = Depends(viewer)) -> StreamingResponse:
    tenants = await run_in_threadpool(tenant_names, svc, who)

    def read() -> tuple[dict[str, str], list[str]]:
        rows, has_more = jobs_page(svc, who, query)
        html = render("_job_rows.html", jobs=rows, viewer=who, tenants=tenants)
        return {"job-rows": html}, [j.id for j in rows if not j.status.terminal]
    return _stream(_changes(svc, read))


@router.get("/jobs/{job_id}")
@signed_in
async def job_stream(job_id: str, svc: Services = Depends(services),
                     who: Viewer = Depends(viewer)) -> StreamingResponse:
    last = [await run_in_threadpool(get_job, svc, who.scope, job_id)]

    def read() -> tuple[dict[str, str], list[str]]:
        """The job as it is now (as it was last seen, once deleted)."""
        record = last[0] = svc.jobs.get(last[0].id, last[0].tenant_id) or last[0]
        context = dict(job=record, viewer=who, **job_parts(svc, record))
        parts = {name: render(f"_job_{name}.html", **context)
                 for name in ("status", "timeline", "outputs", "deliveries")}
        return {f"job-{k}": v for k, v in parts.items()}, [record.id]
    return _stream(_changes(svc, read))

