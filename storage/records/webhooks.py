"""Webhook records: endpoints, their signing secrets, a delivery's work and its log."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class EndpointRecord:
    id: str
    tenant_id: str
    name: str
    url: str
    event_types: tuple[str, ...]
    created_at: datetime
    updated_at: datetime
    disabled_at: datetime | None
    secret_hint: str


@dataclass(frozen=True)
class SecretRecord:
    secret: str
    created_at: datetime
    previous_secret: str | None = None
    previous_expires_at: datetime | None = None

    def active(self, now: datetime) -> tuple[str, ...]:
        """The secrets to sign with now: the current one, and the previous one while a
        rotation keeps it valid."""
        if self.previous_secret and self.previous_expires_at and self.previous_expires_at > now:
            return (self.secret, self.previous_secret)
        return (self.secret,)


@dataclass(frozen=True)
class DeliveryWork:
    """What a delivery task needs for one attempt (the lock on it is ours)."""

    id: int
    token: str
    event_id: str
    event_type: str
    event_created_at: datetime
    job_id: str
    tenant_id: str
    endpoint_id: str | None
    url: str
    attempts: int
    created_at: datetime


@dataclass(frozen=True)
class AttemptRecord:
    attempted_at: datetime
    url_host: str
    status_code: int | None
    error: str | None
    duration_ms: int
    next_attempt_at: datetime | None


@dataclass(frozen=True)
class DeliveryLogRecord:
    id: int
    event_id: str
    event_type: str
    endpoint_id: str | None
    status: str
    next_attempt_at: datetime | None
    created_at: datetime
    attempts: tuple[AttemptRecord, ...]
    job_id: str | None = None  # the job (or batch) the event reports
    tenant_id: str | None = None
