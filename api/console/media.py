"""The bytes behind the console's players and file links, from this origin.

A job's outputs and a batch's files live in the object store, whose signed URLs point
at another origin (S3) and expire after ``OMNIJOBS_SIGNED_URL_TTL_S``; the console's
Content-Security-Policy allows this origin only, and a page left open must still seek.
So the players read ``/console/jobs/{id}/outputs/{index}``: the session and the same
job lookup as every page decide who may, and byte ranges are passed to the store (S3
answers them itself; the local store's files are opened first and served with ranges,
as ``/v1/objects`` serves them), so ``<audio>`` and ``<video>`` seek as they would on
the signed URL.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Header
from fastapi.responses import Response, StreamingResponse

from core.errors import NotFound
from storage.objects import LocalStore

from ..deps import Services, services
from ..routes.batches import get_batch
from ..routes.files import stored_content
from ..routes.jobs import output_of
from ..service import get_job
from ..stored_file import StoredFileResponse
from .pages import signed_in
from .render import ConsoleRoute
from .session import PATH, Viewer, viewer

router = APIRouter(prefix=PATH, route_class=ConsoleRoute, include_in_schema=False)


def _object(svc: Services, key: str, content_type: str, byte_range: str | None) -> Response:
    store = svc.store
    if isinstance(store, LocalStore):
        return StoredFileResponse(store.open(key), content_type)
    part = store.read_range(key, byte_range)
    headers = {"Accept-Ranges": "bytes", "Content-Length": str(part.length)}
    if part.content_range:
        headers["Content-Range"] = part.content_range
    return StreamingResponse(part.chunks, status_code=206 if part.content_range else 200,
                             media_type=content_type, headers=headers)


@router.get("/jobs/{job_id}/outputs/{index}")
@signed_in
def output(job_id: str, index: int,
           byte_range: str | None = Header(default=None, alias="range", max_length=100),
           svc: Services = Depends(services), who: Viewer = Depends(viewer)) -> Response:
    out = output_of(get_job(svc, who.scope, job_id), index)
    return _object(svc, out.key, out.content_type, byte_range)


@router.get("/batches/{batch_id}/files/{file_id}")
@signed_in
def batch_file(batch_id: str, file_id: str, svc: Services = Depends(services),
               who: Viewer = Depends(viewer)) -> Response:
    """A batch's input, output or error file (the batch decides whose it is)."""
    batch = get_batch(svc, who.scope, batch_id)
    if file_id not in (batch.input_file_id, batch.output_file_id, batch.error_file_id):
        raise NotFound(f"batch {batch.id} has no file {file_id[:40]}", param="file_id")
    return stored_content(svc, batch.tenant_id, file_id, "application/jsonl", headers={
        "Content-Disposition": f'attachment; filename="{file_id}.jsonl"'})
