"""``/v1/files``: OpenAI's Files API, for batch inputs (``purpose=batch``) and the output
and error files batches write. The bytes live in the object store."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException

from core.errors import FileTooLarge, InvalidRequest, NotFound, clip
from core.settings import Settings
from core.text import refused_character
from storage.batch_views import FilePublic, file_view
from storage.records import FileRecord, NewFile
from storage.repositories.files import file_key, new_file_id

from ..deps import Services, services, tenant_id
from ..guard import GuardedRoute, body_limit
from ..schemas import Line, ListPage, page_of

router = APIRouter(prefix="/v1/files", route_class=GuardedRoute)

UPLOAD_PURPOSES = ("batch",)
FORM_OVERHEAD = 64 * 1024  # multipart boundaries and the purpose field


def max_body_bytes(settings: Settings) -> int:
    """The upload route's own request body limit: a whole batch file and its form."""
    return settings.batch_max_file_bytes + FORM_OVERHEAD


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True


async def read_upload(request: Request, svc: Services) -> tuple[UploadFile, str]:
    """The multipart form: one ``file`` part (spooled to disk past 1 MB, never held in
    memory whole) and ``purpose``."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_body_bytes(svc.settings):
        raise FileTooLarge(f"file is larger than {svc.settings.batch_max_file_bytes} bytes")
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise InvalidRequest("upload the file as multipart/form-data", param="file")
    try:
        form = await request.form(max_files=1, max_fields=4)
    except HTTPException as exc:
        raise InvalidRequest(f"invalid form: {clip(exc.detail, 100)}", param="file") from None
    upload, purpose = form.get("file"), form.get("purpose")
    if not isinstance(upload, UploadFile):
        raise InvalidRequest("missing required parameter 'file'", param="file")
    if purpose not in UPLOAD_PURPOSES:
        raise InvalidRequest(f"purpose must be one of {', '.join(UPLOAD_PURPOSES)} (got "
                             f"'{clip(purpose)}')", param="purpose")
    if (upload.size or 0) > svc.settings.batch_max_file_bytes:
        raise FileTooLarge(f"file is larger than {svc.settings.batch_max_file_bytes} bytes")
    reason = refused_character(upload.filename or "")
    if reason is not None:
        raise InvalidRequest(f"the file's name {reason}", param="file")
    return upload, purpose


def store_file(svc: Services, tenant: str, upload: UploadFile, purpose: str) -> FileRecord:
    """Stream the bytes to the store, then record the file; a failed record leaves no
    object behind."""
    file_id = new_file_id()
    key = file_key(tenant, file_id)
    upload.file.seek(0)
    svc.store.put_file(key, upload.file, "application/jsonl")
    try:
        return svc.files.create(NewFile(
            id=file_id, tenant_id=tenant, purpose=purpose, bytes=upload.size or 0, key=key,
            filename=(upload.filename or "upload.jsonl")[:255]))
    except Exception:
        svc.store.delete([key])
        raise


@router.post("", response_model=FilePublic)
@body_limit(max_body_bytes)
async def create_file(request: Request, svc: Services = Depends(services),
                      tenant: str = Depends(tenant_id)) -> FilePublic:
    upload, purpose = await read_upload(request, svc)
    try:
        return file_view(await run_in_threadpool(store_file, svc, tenant, upload, purpose))
    finally:
        await upload.close()


def get_file(svc: Services, tenant: str, file_id: str) -> FileRecord:
    record = svc.files.get(file_id, tenant)
    if record is None:
        raise NotFound(f"no file with id '{clip(file_id)}'", param="id")
    return record


@router.get("", response_model=ListPage[FilePublic])
def list_files(after: str | None = Query(default=None, max_length=64),
               limit: int = Query(default=20, ge=1, le=10_000),
               order: Literal["asc", "desc"] = Query(default="desc"),
               purpose: Line | None = Query(default=None, max_length=32),
               svc: Services = Depends(services), tenant: str = Depends(tenant_id)) -> dict:
    records, has_more = svc.files.list(tenant, after=after, limit=limit, order=order,
                                       purpose=purpose)
    return page_of([file_view(r) for r in records], has_more)


@router.get("/{file_id}", response_model=FilePublic)
def retrieve_file(file_id: str, svc: Services = Depends(services),
                  tenant: str = Depends(tenant_id)) -> FilePublic:
    return file_view(get_file(svc, tenant, file_id))


@router.get("/{file_id}/content")
def file_content(file_id: str, svc: Services = Depends(services),
                 tenant: str = Depends(tenant_id)) -> StreamingResponse:
    record = get_file(svc, tenant, file_id)
    return StreamingResponse(svc.store.stream(record.key), media_type="application/jsonl",
                             headers={"Content-Length": str(record.bytes)})


@router.delete("/{file_id}", response_model=FileDeleted)
def delete_file(file_id: str, svc: Services = Depends(services),
                tenant: str = Depends(tenant_id)) -> FileDeleted:
    record = svc.files.delete(get_file(svc, tenant, file_id).id, tenant)
    if record is None:
        raise NotFound(f"no file with id '{clip(file_id)}'", param="id")
    svc.store.delete([record.key])
    return FileDeleted(id=record.id)
