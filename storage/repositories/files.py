"""OpenAI files: batch inputs and the output and error files batches write. The rows say
what exists; the bytes are in the object store until the file expires (then they are
deleted and the row records it). A tenant's files together are capped by its storage
quota, counted in the transaction that records an upload."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session, sessionmaker

from core.errors import InvalidRequest, StorageQuotaExceeded

from ..models import File, Tenant
from ..records import FileRecord, NewFile

# File ids are minted here; anything else names no file and is never sent to the
# database (where a NUL byte is an error rather than a miss).
FILE_ID = re.compile(r"file-[0-9a-f]{32}")


def new_file_id() -> str:
    return "file-" + uuid.uuid4().hex


def file_key(tenant_id: str, file_id: str) -> str:
    """Outside any ``<tenant>/<job id>/`` prefix, so no job's cleanup ever touches it."""
    return f"{tenant_id}/files/{file_id}.jsonl"


def add_file(s: Session, new: NewFile, now: datetime) -> FileRecord:
    """Stage the file's row inside the caller's transaction."""
    expires = None if new.expires_after_s is None else now + timedelta(
        seconds=new.expires_after_s)
    row = File(id=new.id or new_file_id(), tenant_id=new.tenant_id, purpose=new.purpose,
               filename=new.filename, bytes=new.bytes, key=new.key, created_at=now,
               expires_at=expires)
    s.add(row)
    return _record(row)


def _record(f: File) -> FileRecord:
    return FileRecord(id=f.id, tenant_id=f.tenant_id, purpose=f.purpose, filename=f.filename,
                      bytes=f.bytes, key=f.key, created_at=f.created_at,
                      expires_at=f.expires_at, expired_at=f.expired_at)


def _stored_bytes(s: Session, tenant_id: str):
    """What a tenant's files hold in the store (expired ones hold nothing)."""
    return s.scalar(select(func.coalesce(func.sum(File.bytes), 0)).where(
        File.tenant_id == tenant_id, File.expired_at.is_(None)))


def quota_refusal(used: int, adding: int, quota: int) -> StorageQuotaExceeded | None:
    if used + adding <= quota:
        return None
    return StorageQuotaExceeded(
        f"this file ({adding} bytes) would take the tenant's files past their storage "
        f"quota of {quota} bytes ({used} in use); delete files or wait for some to expire")


class FileRepository:
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    def create(self, new: NewFile, quota_bytes: int | None = None) -> FileRecord:
        """Record a stored file; with ``quota_bytes``, only if the tenant's files stay
        within it (StorageQuotaExceeded). Uploads of one tenant are serialised on its
        row, so two racing uploads cannot both pass the quota."""
        with self._sessions.begin() as s:
            if quota_bytes is not None:
                s.execute(select(Tenant.id).where(Tenant.id == new.tenant_id)
                          .with_for_update())
                refusal = quota_refusal(_stored_bytes(s, new.tenant_id), new.bytes,
                                        quota_bytes)
                if refusal is not None:
                    raise refusal
            return add_file(s, new, datetime.now(UTC))

    def stored_bytes(self, tenant_id: str) -> int:
        with self._sessions() as s:
            return int(_stored_bytes(s, tenant_id))

    def to_expire(self, limit: int = 500) -> list[FileRecord]:
        """Files past their expiry whose bytes are still stored, oldest expiry first."""
        with self._sessions() as s:
            return [_record(f) for f in s.scalars(select(File).where(
                File.expires_at <= datetime.now(UTC), File.expired_at.is_(None))
                .order_by(File.expires_at).limit(limit))]

    def mark_expired(self, file_id: str) -> bool:
        """The file's bytes are deleted; its record stays (status ``expired``)."""
        with self._sessions.begin() as s:
            return s.execute(update(File).where(File.id == file_id, File.expired_at.is_(None))
                             .values(expired_at=datetime.now(UTC))).rowcount == 1

    def get(self, file_id: str, tenant_id: str | None = None) -> FileRecord | None:
        if not FILE_ID.fullmatch(file_id):
            return None
        with self._sessions() as s:
            q = select(File).where(File.id == file_id)
            if tenant_id is not None:
                q = q.where(File.tenant_id == tenant_id)
            row = s.scalar(q)
            return _record(row) if row else None

    def list(self, tenant_id: str, *, after: str | None = None, limit: int = 20,
             order: str = "desc", purpose: str | None = None
             ) -> tuple[list[FileRecord], bool]:
        """Cursor pagination on (created_at, id); returns (page, has_more)."""
        with self._sessions() as s:
            q = select(File).where(File.tenant_id == tenant_id)
            if purpose is not None:
                q = q.where(File.purpose == purpose)
            keys = (File.created_at, File.id)
            if after is not None:
                q = q.where(_beyond(keys, _cursor(s, tenant_id, after), order))
            q = q.order_by(*(k.desc() if order == "desc" else k.asc() for k in keys))
            rows = s.scalars(q.limit(limit + 1)).all()
            return [_record(f) for f in rows[:limit]], len(rows) > limit

    def delete(self, file_id: str, tenant_id: str) -> FileRecord | None:
        """Remove the row; returns what it was (its key is the caller's to delete)."""
        if not FILE_ID.fullmatch(file_id):
            return None
        with self._sessions.begin() as s:
            row = s.scalar(select(File).where(File.id == file_id, File.tenant_id == tenant_id))
            if row is None:
                return None
            record = _record(row)
            s.execute(delete(File).where(File.id == file_id))
            return record


def _cursor(s: Session, tenant_id: str, after: str):
    """(created_at, id) of the tenant's file ``after``; an unknown one is an error."""
    row = s.execute(select(File.created_at, File.id).where(
        File.id == after, File.tenant_id == tenant_id)).first() if FILE_ID.fullmatch(
        after) else None
    if row is None:
        raise InvalidRequest("'after' is not a file of this list (unknown or deleted)",
                             param="after", code="invalid_cursor")
    return row


def _beyond(keys, cursor, order: str):
    """Rows after ``cursor`` in (created_at, id) order (before it, newest first)."""
    (at, ident), (at_value, id_value) = keys, cursor
    if order == "desc":
        return (at < at_value) | ((at == at_value) & (ident < id_value))
    return (at > at_value) | ((at == at_value) & (ident > id_value))
