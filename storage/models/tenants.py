"""Tenants, their per-pipeline service clocks, API keys and console sessions."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    Boolean,
    Float,
    ForeignKey,
    Index,
    String,
    false,
)
from sqlalchemy.orm import Mapped, mapped_column

from .base import Base, UTCDateTime


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # Its share of each lane against the other tenants waiting there (``tenants weight``).
    share_weight: Mapped[float] = mapped_column(Float, default=1.0, server_default="1")


class TenantService(Base):
    """How much service a tenant has had in one pipeline's lane: its stride-scheduling
    pass (every claim adds ``1 / share_weight``). The fair claim serves the waiting
    tenant with the lowest pass; ``lane_clocks`` keeps a returning tenant from
    replaying the service it missed while it was away."""

    __tablename__ = "tenant_service"

    pipeline: Mapped[str] = mapped_column(String(200), primary_key=True)
    lane: Mapped[str] = mapped_column(String(16), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True)
    pass_: Mapped[float] = mapped_column("pass", Float)


class LaneClock(Base):
    """One pipeline's lane: the pass of the last tenant served (its virtual time), and
    the row every claim in the lane locks first, so claims in a lane take turns."""

    __tablename__ = "lane_clocks"

    pipeline: Mapped[str] = mapped_column(String(200), primary_key=True)
    lane: Mapped[str] = mapped_column(String(16), primary_key=True)
    vtime: Mapped[float] = mapped_column(Float)


class ApiKey(Base):
    """Keys are stored as SHA-256 hashes; only the prefix is kept in clear for display."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    prefix: Mapped[str] = mapped_column(String(16))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # An operator's key: the console shows it every tenant (``keys create --operator``).
    operator: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class ConsoleSession(Base):
    """A browser signed in to the console with a key. Only the SHA-256 of the cookie's
    token is stored; the row goes with its key (revoked keys end their sessions too)."""

    __tablename__ = "console_sessions"
    __table_args__ = (Index("ix_console_sessions_last_seen", "last_seen_at"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    key_id: Mapped[str] = mapped_column(ForeignKey("api_keys.id", ondelete="CASCADE"))
    csrf: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    last_seen_at: Mapped[datetime] = mapped_column(UTCDateTime())
