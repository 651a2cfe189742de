"""Webhook endpoints, secrets, per-job subscriptions, events, deliveries, attempts."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    JSON,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
)
from sqlalchemy.orm import Mapped, mapped_column

from .base import Base, UTCDateTime


class WebhookEndpoint(Base):
    """A registered endpoint (OpenAI's webhook_endpoint): receives its tenant's events."""

    __tablename__ = "webhook_endpoints"
    __table_args__ = (Index("ix_webhook_endpoints_tenant_created", "tenant_id", "created_at",
                            "id"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(256))
    url: Mapped[str] = mapped_column(Text)
    event_types: Mapped[list] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    disabled_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class WebhookSecret(Base):
    """The signing secret of an endpoint (``owner_id`` = its id) or a tenant's default
    secret for per-job URLs (``owner_id`` = the tenant's id). Kept in clear: signing
    needs it. A rotation keeps the previous one until ``previous_expires_at``."""

    __tablename__ = "webhook_secrets"

    owner_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    secret: Mapped[str] = mapped_column(String(100))
    previous_secret: Mapped[str | None] = mapped_column(String(100))
    previous_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class JobWebhook(Base):
    """A job's own callback URL (``webhook_url`` at submit), stored with the job."""

    __tablename__ = "job_webhooks"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"),
                                        primary_key=True)
    url: Mapped[str] = mapped_column(Text)
    event_types: Mapped[list] = mapped_column(JSON)
    stopped_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class WebhookEvent(Base):
    """An event, written in the transaction of the transition it reports. No foreign
    key to the job: a deleted video's ``cancelled`` event still goes out."""

    __tablename__ = "webhook_events"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    job_id: Mapped[str] = mapped_column(String(40), index=True)
    type: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class WebhookDelivery(Base):
    """One event to one target (an endpoint, or the job's own URL), retried until it
    succeeds, is stopped or runs out of attempts. ``lock_token``/``locked_until`` mark
    the one dispatch in flight; an expired lock is dispatched again."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (Index("ix_webhook_deliveries_due", "status", "next_attempt_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    event_id: Mapped[str] = mapped_column(ForeignKey("webhook_events.id", ondelete="CASCADE"),
                                          index=True)
    endpoint_id: Mapped[str | None] = mapped_column(
        ForeignKey("webhook_endpoints.id", ondelete="CASCADE"))
    url: Mapped[str | None] = mapped_column(Text)
    target: Mapped[str] = mapped_column(String(40))
    status: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    locked_until: Mapped[datetime | None] = mapped_column(UTCDateTime())
    lock_token: Mapped[str | None] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


class WebhookAttempt(Base):
    """One HTTP attempt of a delivery, for the delivery log."""

    __tablename__ = "webhook_attempts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    delivery_id: Mapped[int] = mapped_column(
        ForeignKey("webhook_deliveries.id", ondelete="CASCADE"), index=True)
    attempted_at: Mapped[datetime] = mapped_column(UTCDateTime())
    url_host: Mapped[str] = mapped_column(String(300))
    status_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(String(300))
    duration_ms: Mapped[int] = mapped_column(Integer)
    next_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
