"""The worker registry: one row per live worker or maintenance process."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    JSON,
    Integer,
    String,
)
from sqlalchemy.orm import Mapped, mapped_column

from .base import Base, UTCDateTime


class Worker(Base):
    """A process of the fleet (a render worker or the maintenance process) as its own
    heartbeat last described it. A row whose ``expires_at`` has passed is a dead process:
    readers leave it out, maintenance deletes it later."""

    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(200), primary_key=True)
    role: Mapped[str] = mapped_column(String(16))
    host: Mapped[str] = mapped_column(String(200))
    pid: Mapped[int] = mapped_column(Integer)
    pipelines: Mapped[list] = mapped_column(JSON)
    device: Mapped[str | None] = mapped_column(String(200))
    version: Mapped[str] = mapped_column(String(64))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime())
    heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
    job_id: Mapped[str | None] = mapped_column(String(40))
    draining_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # The engine's slots, those held, and every job in flight as [id, pipeline,
    # finalizing] (a worker keeps several on one engine).
    slots: Mapped[int] = mapped_column(Integer, server_default="1")
    slots_busy: Mapped[int] = mapped_column(Integer, server_default="0")
    in_flight: Mapped[list] = mapped_column(JSON, server_default="[]")
