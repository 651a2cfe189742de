"""Webhooks: endpoints, signing secrets, per-job URLs, events and their deliveries.

The repository keeps endpoints and secrets here; events are staged inside the job
transitions they report (storage/repositories/webhook_events.py), deliveries are locked,
started and finished on their schedule (webhook_deliveries.py), and the delivery log is
read and replayed in webhook_log.py. The names callers use are all importable from here.
"""

from __future__ import annotations

import base64
import re
import secrets
import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from core.errors import InvalidRequest

from ..models import Tenant, WebhookEndpoint, WebhookSecret
from ..records import DeliveryLogRecord, EndpointRecord, SecretRecord
from . import webhook_log
from .scope import tenant_is
from .webhook_deliveries import DeliverySchedule, url_host  # noqa: F401 (re-exported)
from .webhook_events import (  # noqa: F401 (re-exported: the job and batch repositories')
    EVENT_TYPES,
    JOB_EVENTS,
    default_events,
    new_event_id,
    stage_batch_event,
    stage_job_event,
    subscribe_job,
    withdraw_event,
)
from .webhook_log import FAILED, PENDING, STOPPED, SUCCEEDED  # noqa: F401 (statuses)

ROTATION_GRACE = timedelta(hours=24)
# Endpoint ids are minted here ("we_" + a UUID's hex); anything else names no endpoint and
# is never sent to the database (where a NUL byte is an error rather than a miss).
ENDPOINT_ID = re.compile(r"we_[0-9a-f]{32}")


def _now() -> datetime:
    return datetime.now(UTC)


def new_secret() -> str:
    """Standard Webhooks' form: ``whsec_`` + base64 of 32 random bytes."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def _endpoint_record(e: WebhookEndpoint, secret: str) -> EndpointRecord:
    return EndpointRecord(id=e.id, tenant_id=e.tenant_id, name=e.name, url=e.url,
                          event_types=tuple(e.event_types), created_at=e.created_at,
                          updated_at=e.updated_at, disabled_at=e.disabled_at,
                          secret_hint=f"whsec_...{secret[-4:]}")


def _secret_record(row: WebhookSecret) -> SecretRecord:
    return SecretRecord(secret=row.secret, created_at=row.created_at,
                        previous_secret=row.previous_secret,
                        previous_expires_at=row.previous_expires_at)


class WebhookRepository(DeliverySchedule):
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    # ---- registered endpoints ---------------------------------------------------------

    def create_endpoint(self, tenant_id: str, *, name: str, url: str,
                        event_types: list[str]) -> tuple[EndpointRecord, str]:
        """A new endpoint and its secret (returned once, in clear)."""
        now, secret = _now(), new_secret()
        endpoint = WebhookEndpoint(id="we_" + uuid.uuid4().hex, tenant_id=tenant_id, name=name,
                                   url=url, event_types=event_types, created_at=now,
                                   updated_at=now)
        with self._sessions.begin() as s:
            s.add(endpoint)
            s.add(WebhookSecret(owner_id=endpoint.id, tenant_id=tenant_id, secret=secret,
                                created_at=now))
        return _endpoint_record(endpoint, secret), secret

    def _owned(self, s: Session, tenant_id: str | None, endpoint_id: str
               ) -> tuple[WebhookEndpoint, WebhookSecret] | None:
        if not ENDPOINT_ID.fullmatch(endpoint_id):
            return None
        row = s.execute(select(WebhookEndpoint, WebhookSecret).join(
            WebhookSecret, WebhookSecret.owner_id == WebhookEndpoint.id).where(
            WebhookEndpoint.id == endpoint_id,
            tenant_is(WebhookEndpoint.tenant_id, tenant_id))).first()
        return (row[0], row[1]) if row else None

    def get_endpoint(self, tenant_id: str | None, endpoint_id: str) -> EndpointRecord | None:
        with self._sessions() as s:
            row = self._owned(s, tenant_id, endpoint_id)
            return _endpoint_record(row[0], row[1].secret) if row else None

    def list_endpoints(self, tenant_id: str | None, *, after: str | None = None,
                       limit: int = 20) -> tuple[list[EndpointRecord], bool]:
        """Newest first, cursor on (created_at, id); ``None``: every tenant's."""
        mine = tenant_is(WebhookEndpoint.tenant_id, tenant_id)
        with self._sessions() as s:
            q = select(WebhookEndpoint, WebhookSecret.secret).join(
                WebhookSecret, WebhookSecret.owner_id == WebhookEndpoint.id).where(mine)
            if after is not None:
                cursor = None if not ENDPOINT_ID.fullmatch(after) else s.execute(
                    select(WebhookEndpoint.created_at, WebhookEndpoint.id).where(
                        WebhookEndpoint.id == after, mine)).first()
                if cursor is None:
                    raise InvalidRequest("'after' is not an endpoint of this list (unknown "
                                         "or deleted)", param="after", code="invalid_cursor")
                q = q.where((WebhookEndpoint.created_at < cursor[0])
                            | ((WebhookEndpoint.created_at == cursor[0])
                               & (WebhookEndpoint.id < cursor[1])))
            rows = s.execute(q.order_by(WebhookEndpoint.created_at.desc(),
                                        WebhookEndpoint.id.desc()).limit(limit + 1)).all()
            return [_endpoint_record(e, sec) for e, sec in rows[:limit]], len(rows) > limit

    def update_endpoint(self, tenant_id: str, endpoint_id: str, **changes: object
                        ) -> EndpointRecord | None:
        """Apply the given fields; ``updated_at`` moves only if something changed. An
        update re-enables an endpoint that a 410 disabled."""
        with self._sessions.begin() as s:
            row = self._owned(s, tenant_id, endpoint_id)
            if row is None:
                return None
            endpoint, secret = row
            changed = {k: v for k, v in changes.items() if getattr(endpoint, k) != v}
            for key, value in changed.items():
                setattr(endpoint, key, value)
            if changed or endpoint.disabled_at is not None:
                endpoint.updated_at, endpoint.disabled_at = _now(), None
            return _endpoint_record(endpoint, secret.secret)

    def delete_endpoint(self, tenant_id: str, endpoint_id: str) -> bool:
        if not ENDPOINT_ID.fullmatch(endpoint_id):
            return False
        with self._sessions.begin() as s:
            gone = s.execute(delete(WebhookEndpoint).where(
                WebhookEndpoint.id == endpoint_id,
                WebhookEndpoint.tenant_id == tenant_id)).rowcount == 1
            if gone:
                s.execute(delete(WebhookSecret).where(WebhookSecret.owner_id == endpoint_id))
            return gone

    def rotate_endpoint_secret(self, tenant_id: str, endpoint_id: str, keep_old: bool
                               ) -> tuple[EndpointRecord, str] | None:
        with self._sessions.begin() as s:
            row = self._owned(s, tenant_id, endpoint_id)
            if row is None:
                return None
            endpoint, secret = row
            _rotate(secret, keep_old)
            endpoint.updated_at = secret.created_at
            return _endpoint_record(endpoint, secret.secret), secret.secret

    # ---- secrets ------------------------------------------------------------------------

    def tenant_id(self, name: str) -> str | None:
        with self._sessions() as s:
            return s.scalar(select(Tenant.id).where(Tenant.name == name))

    def default_secret(self, tenant_id: str) -> SecretRecord:
        """The tenant's secret for per-job URLs, created on first use."""
        return self.secret_of(tenant_id, tenant_id)

    def secret_of(self, owner_id: str, tenant_id: str) -> SecretRecord:
        for _ in range(2):
            with self._sessions() as s:
                row = s.get(WebhookSecret, owner_id)
                if row is not None:
                    return _secret_record(row)
            try:
                with self._sessions.begin() as s:
                    s.add(WebhookSecret(owner_id=owner_id, tenant_id=tenant_id,
                                        secret=new_secret(), created_at=_now()))
            except IntegrityError:  # created concurrently: read that one
                continue
        with self._sessions() as s:
            return _secret_record(s.get_one(WebhookSecret, owner_id))

    def rotate_default_secret(self, tenant_id: str) -> SecretRecord:
        """A new default secret; the old one stays valid for 24 hours."""
        self.default_secret(tenant_id)
        with self._sessions.begin() as s:
            row = s.get_one(WebhookSecret, tenant_id, with_for_update=True)
            _rotate(row, keep_old=True)
            return _secret_record(row)

    # ---- the delivery log (storage/repositories/webhook_log.py) -------------------------

    def deliveries_for_job(self, tenant_id: str, job_id: str) -> list[DeliveryLogRecord]:
        with self._sessions() as s:
            return webhook_log.for_job(s, tenant_id, job_id)

    def recent_deliveries(self, tenant_id: str | None, endpoint_id: str, limit: int = 20
                          ) -> list[DeliveryLogRecord]:
        with self._sessions() as s:
            return webhook_log.for_endpoint(s, tenant_id, endpoint_id, limit)

    def failure_rates(self, endpoint_ids: list[str], since: datetime
                      ) -> dict[str, tuple[int, int]]:
        with self._sessions() as s:
            return webhook_log.failure_rates(s, endpoint_ids, since)

    def replay(self, tenant_id: str | None, delivery_id: int) -> DeliveryLogRecord | None:
        with self._sessions.begin() as s:
            return webhook_log.replay(s, tenant_id, delivery_id)


def _rotate(row: WebhookSecret, keep_old: bool) -> None:
    now = _now()
    row.previous_secret = row.secret if keep_old else None
    row.previous_expires_at = now + ROTATION_GRACE if keep_old else None
    row.secret, row.created_at = new_secret(), now
