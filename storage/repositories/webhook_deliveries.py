"""Webhook deliveries on their schedule: locked for dispatch, started, finished.

Deliveries are rows with a schedule (``next_attempt_at``) and a lock (``lock_token`` +
``locked_until``): the scheduler locks due ones and hands them to delivery tasks; a lock
that expires (a killed worker) is simply dispatched again. One at a time per target, in
order.
"""

from __future__ import annotations

import uuid
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from ..models import JobWebhook, WebhookAttempt, WebhookDelivery, WebhookEndpoint, WebhookEvent
from ..records import AttemptRecord, DeliveryWork
from .webhook_log import PENDING, STOPPED, unlocked


def _now() -> datetime:
    return datetime.now(UTC)


def url_host(url: str) -> str:
    return urlsplit(url).netloc.rpartition("@")[2][:300]


class DeliverySchedule:
    """``WebhookRepository``'s deliveries (its ``_sessions``)."""

    _sessions: sessionmaker[Session]

    def claim_due(self, lock_s: float, limit: int = 100) -> list[tuple[int, str]]:
        """Lock due deliveries for dispatch: the oldest due one of each target only, and
        none for a target that has one in flight (ordered, one at a time per target).
        Chosen in SQL, one row per free target, oldest first: a target with thousands of
        due rows and a slow receiver costs one candidate, never a window of them that
        would hide every other tenant's deliveries."""
        now = _now()
        with self._sessions.begin() as s:
            busy = select(WebhookDelivery.target).where(
                WebhookDelivery.status == PENDING, WebhookDelivery.locked_until > now)
            oldest = func.min(WebhookDelivery.id)
            ids = s.scalars(select(oldest).where(
                WebhookDelivery.status == PENDING, WebhookDelivery.next_attempt_at <= now,
                unlocked(now), WebhookDelivery.target.not_in(busy))
                .group_by(WebhookDelivery.target).order_by(oldest).limit(limit)).all()
            claimed = []
            for delivery_id in ids:
                token = _lock(s, delivery_id, now, lock_s)
                if token is not None:
                    claimed.append((delivery_id, token))
            return claimed

    def start(self, delivery_id: int, token: str, lock_s: float) -> DeliveryWork | None:
        """Renew our lock and read what the attempt needs; None if the dispatch is stale
        (another took over after our lock expired) or the target is gone or disabled."""
        now = _now()
        with self._sessions.begin() as s:
            renewed = s.execute(update(WebhookDelivery).where(
                WebhookDelivery.id == delivery_id, WebhookDelivery.lock_token == token,
                WebhookDelivery.status == PENDING).values(
                locked_until=now + timedelta(seconds=lock_s))).rowcount == 1
            if not renewed:
                return None
            d, evt = s.execute(select(WebhookDelivery, WebhookEvent).join(
                WebhookEvent, WebhookEvent.id == WebhookDelivery.event_id).where(
                WebhookDelivery.id == delivery_id)).one()
            url = d.url
            if d.endpoint_id is not None:
                endpoint = s.get(WebhookEndpoint, d.endpoint_id)
                if endpoint is None or endpoint.disabled_at is not None:
                    d.status, d.lock_token, d.locked_until = STOPPED, None, None
                    return None
                url = endpoint.url
            return DeliveryWork(id=d.id, token=token, event_id=evt.id, event_type=evt.type,
                                event_created_at=evt.created_at, job_id=evt.job_id,
                                tenant_id=evt.tenant_id, endpoint_id=d.endpoint_id, url=url,
                                attempts=d.attempts, created_at=d.created_at)

    def finish(self, work: DeliveryWork, attempt: AttemptRecord, status: str,
               lock_s: float) -> list[tuple[int, str]] | None:
        """Record the attempt and the delivery's new state (CAS on our lock). Returns
        None if the lock was no longer ours, else the next due delivery of the same
        target, locked for dispatch (a list of at most one)."""
        now = _now()
        with self._sessions.begin() as s:
            res = s.execute(update(WebhookDelivery).where(
                WebhookDelivery.id == work.id, WebhookDelivery.lock_token == work.token,
                WebhookDelivery.status == PENDING).values(
                status=status, attempts=WebhookDelivery.attempts + 1,
                next_attempt_at=attempt.next_attempt_at if status == PENDING else None,
                lock_token=None, locked_until=None, updated_at=now))
            if res.rowcount != 1:
                return None
            s.add(WebhookAttempt(delivery_id=work.id, **asdict(attempt)))
            if status == STOPPED:
                _stop_target(s, work, now)
            nxt = s.scalar(select(WebhookDelivery.id).where(
                WebhookDelivery.target == _target(work), WebhookDelivery.id != work.id,
                WebhookDelivery.status == PENDING, WebhookDelivery.next_attempt_at <= now,
                unlocked(now))
                .order_by(WebhookDelivery.id).limit(1))
            token = _lock(s, nxt, now, lock_s) if nxt is not None else None
            return [(nxt, token)] if token else []


def _lock(s: Session, delivery_id: int, now: datetime, lock_s: float) -> str | None:
    token = uuid.uuid4().hex
    res = s.execute(update(WebhookDelivery).where(
        WebhookDelivery.id == delivery_id, WebhookDelivery.status == PENDING,
        unlocked(now)).values(lock_token=token,
                               locked_until=now + timedelta(seconds=lock_s)))
    return token if res.rowcount == 1 else None


def _target(work: DeliveryWork) -> str:
    return work.endpoint_id or work.job_id


def _stop_target(s: Session, work: DeliveryWork, now: datetime) -> None:
    """A 410: disable the endpoint, or stop the job's own URL; drop what was pending."""
    if work.endpoint_id is not None:
        s.execute(update(WebhookEndpoint).where(WebhookEndpoint.id == work.endpoint_id)
                  .values(disabled_at=now))
    else:
        s.execute(update(JobWebhook).where(JobWebhook.job_id == work.job_id)
                  .values(stopped_at=now))
    s.execute(update(WebhookDelivery).where(
        WebhookDelivery.target == _target(work), WebhookDelivery.status == PENDING).values(
        status=STOPPED, next_attempt_at=None, lock_token=None, locked_until=None,
        updated_at=now))
