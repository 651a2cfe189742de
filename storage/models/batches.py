"""Uploaded files and batches, with the lines a batch rejected."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    JSON,
    BigInteger,
    ForeignKey,
    Index,
    Integer,
    String,
)
from sqlalchemy.orm import Mapped, mapped_column

from .base import Base, UTCDateTime


class File(Base):
    """An OpenAI file: a batch input (``purpose=batch``) or a batch's output or error file
    (``batch_output``). The bytes live in the object store under ``key`` until
    ``expires_at``; then they are deleted and ``expired_at`` set, the row kept."""

    __tablename__ = "files"
    __table_args__ = (Index("ix_files_tenant_created", "tenant_id", "created_at", "id"),
                      Index("ix_files_expires_at", "expires_at"))

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    purpose: Mapped[str] = mapped_column(String(32))
    filename: Mapped[str] = mapped_column(String(255))
    bytes: Mapped[int] = mapped_column(BigInteger)
    key: Mapped[str] = mapped_column(String(500))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    expired_at: Mapped[datetime | None] = mapped_column(UTCDateTime())  # bytes deleted


class Batch(Base):
    """An OpenAI batch. Its requests are jobs (``jobs.batch_id``) and, for lines whose body
    the endpoint refused, rejections. ``lease_*`` marks the one process validating or
    finalizing it; a lease that runs out is taken over."""

    __tablename__ = "batches"
    __table_args__ = (Index("ix_batches_tenant_created", "tenant_id", "created_at", "id"),
                      Index("ix_batches_status", "status"))

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    endpoint: Mapped[str] = mapped_column(String(32))
    input_file_id: Mapped[str] = mapped_column(String(40))
    completion_window: Mapped[str] = mapped_column(String(8))
    status: Mapped[str] = mapped_column(String(16))
    metadata_: Mapped[dict | None] = mapped_column("metadata", JSON)
    errors: Mapped[list | None] = mapped_column(JSON)
    output_file_id: Mapped[str | None] = mapped_column(String(40))
    error_file_id: Mapped[str | None] = mapped_column(String(40))
    total: Mapped[int] = mapped_column(Integer, default=0)
    completed: Mapped[int] = mapped_column(Integer, default=0)
    failed: Mapped[int] = mapped_column(Integer, default=0)
    rejected: Mapped[int] = mapped_column(Integer, default=0)
    lease_token: Mapped[str | None] = mapped_column(String(32))
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
    in_progress_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finalizing_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    failed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    expired_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    cancelling_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    cancelled_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # OpenAI's output_expires_after: the output and error files expire this long after
    # they are written (None: OMNIJOBS_FILE_TTL_S)
    output_expires_after_s: Mapped[int | None] = mapped_column(Integer)


class BatchRejection(Base):
    """A batch line whose body the endpoint refused: the answer it would have given."""

    __tablename__ = "batch_rejections"

    batch_id: Mapped[str] = mapped_column(ForeignKey("batches.id", ondelete="CASCADE"),
                                          primary_key=True)
    line: Mapped[int] = mapped_column(Integer, primary_key=True)
    custom_id: Mapped[str] = mapped_column(String(512))
    status_code: Mapped[int] = mapped_column(Integer)
    body: Mapped[dict] = mapped_column(JSON)
