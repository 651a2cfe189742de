"""``/v1/files``: OpenAI's Files API, for batch inputs (``purpose=batch``) and the output
and error files batches write. The bytes live in the object store until the file
expires (``expires_after``, by default ``OMNIJOBS_FILE_TTL_S``); a tenant's files are
capped by its storage quota."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException

from core.errors import FileExpired, FileTooLarge, InvalidRequest, NotFound, clip
from core.settings import Settings
from core.text import refused_character
from storage.batch_views import FilePublic, file_view
from storage.records import FileRecord, NewFile
from storage.repositories.files import file_key, new_file_id, quota_refusal

from ..deps import Services, services, tenant_id
from ..guard import GuardedRoute, body_limit
from ..schemas import ExpiresAfter, Line, ListPage, page_of

router = APIRouter(prefix="/v1/files", route_class=GuardedRoute)

UPLOAD_PURPOSES = ("batch",)
FORM_OVERHEAD = 64 * 1024  # multipart boundaries and the purpose field
POLICY = "expires_after"  # sent as expires_after[anchor] and expires_after[seconds]
# A file's content is served as OpenAI's API declares it (the bytes are JSON lines).
CONTENT_TYPE = "application/json"


def max_body_bytes(settings: Settings) -> int:
    """The upload route's own request body limit: a whole batch file and its form."""
    return settings.batch_max_file_bytes + FORM_OVERHEAD


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True


@dataclass(frozen=True)
class Upload:
    """An upload's form, read and checked."""

    file: UploadFile
    purpose: str
    expires_after_s: int


async def read_upload(request: Request, svc: Services) -> Upload:
    """The multipart form: one ``file`` part (spooled to disk past 1 MB, never held in
    memory whole), ``purpose`` and OpenAI's ``expires_after``."""
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
    return Upload(file=upload, purpose=purpose,
                  expires_after_s=expires_after(form, svc.settings.file_ttl_s))


def expires_after(form: FormData, default_s: int) -> int:
    """Seconds from upload to expiry: the form's policy (as the SDK sends it, bracketed
    fields, or one JSON field), else the default."""
    fields = {name[len(POLICY) + 1:-1]: value for name, value in form.multi_items()
              if name.startswith(POLICY + "[") and name.endswith("]")}
    if POLICY in form:
        try:
            fields = json.loads(form[POLICY])
        except (TypeError, ValueError):
            fields = form[POLICY]
    elif not fields:
        return default_s
    try:
        return ExpiresAfter.model_validate(fields).seconds
    except ValidationError as exc:
        problem = exc.errors()[0]
        where = ".".join(str(p) for p in problem["loc"])
        raise InvalidRequest(f"invalid expires_after{f' {where}' if where else ''}: "
                             f"{problem['msg']} (an anchor of 'created_at' and seconds from "
                             "3600 to 2592000)", param=POLICY) from None


def store_file(svc: Services, tenant: str, upload: Upload) -> FileRecord:
    """Stream the bytes to the store, then record the file (counted against the quota
    again, in that transaction); a failed record leaves no object behind."""
    quota, size = svc.settings.tenant_storage_bytes, upload.file.size or 0
    refusal = quota_refusal(svc.files.stored_bytes(tenant), size, quota)
    if refusal is not None:  # before 200 MB are streamed to the store for nothing
        raise refusal
    file_id = new_file_id()
    key = file_key(tenant, file_id)
    upload.file.file.seek(0)
    svc.store.put_file(key, upload.file.file, "application/jsonl")
    try:
        return svc.files.create(NewFile(
            id=file_id, tenant_id=tenant, purpose=upload.purpose, bytes=size, key=key,
            filename=(upload.file.filename or "upload.jsonl")[:255],
            expires_after_s=upload.expires_after_s), quota_bytes=quota)
    except Exception:
        svc.store.delete([key])
        raise


@router.post("", response_model=FilePublic)
@body_limit(max_body_bytes)
async def create_file(request: Request, svc: Services = Depends(services),
                      tenant: str = Depends(tenant_id)) -> FilePublic:
    upload = await read_upload(request, svc)
    try:
        return file_view(await run_in_threadpool(store_file, svc, tenant, upload))
    finally:
        await upload.file.close()


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
    return stored_content(svc, tenant, file_id)


def stored_content(svc: Services, tenant: str, file_id: str, media_type: str = CONTENT_TYPE,
                   headers: dict[str, str] | None = None) -> StreamingResponse:
    """A file's bytes, or 410 once it has expired (the record stays): every download of
    a file, the console's too, goes through this one check."""
    record = get_file(svc, tenant, file_id)
    if not record.expired(datetime.now(UTC)):
        try:
            return StreamingResponse(svc.store.stream(record.key),
                                     media_type=media_type,
                                     headers={"Content-Length": str(record.bytes),
                                              **(headers or {})})
        except NotFound:  # deleted, or expired, since it was read
            record = get_file(svc, tenant, file_id)
            if not record.expired(datetime.now(UTC)):
                raise
    raise FileExpired(f"file {record.id} has expired; its content was deleted (the record "
                      "stays)")


@router.delete("/{file_id}", response_model=FileDeleted)
def delete_file(file_id: str, svc: Services = Depends(services),
                tenant: str = Depends(tenant_id)) -> FileDeleted:
    record = svc.files.delete(get_file(svc, tenant, file_id).id, tenant)
    if record is None:
        raise NotFound(f"no file with id '{clip(file_id)}'", param="id")
    svc.store.delete([record.key])
    return FileDeleted(id=record.id)
