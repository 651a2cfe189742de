"""The webhook delivery log: what was sent where and how each attempt went (a job's
deliveries, an endpoint's recent ones and its failure rate), and replay: a delivery sent
once more, now. A replay only puts the delivery back on the schedule (``pending``, due
now): the delivery task sends it, as every attempt, with the same ``webhook-id`` and the
secret that is current when it is sent."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import func, or_, select, update
from sqlalchemy.orm import Session

from core.errors import Conflict

from ..models import JobWebhook, WebhookAttempt, WebhookDelivery, WebhookEndpoint, WebhookEvent
from ..records import AttemptRecord, DeliveryLogRecord
from .scope import tenant_is

PENDING, SUCCEEDED, FAILED, STOPPED = "pending", "succeeded", "failed", "stopped"
DELIVERY_PREFIX = "whd_"
MAX_ID = 2**31 - 1  # the id column is a 32-bit integer


def _now() -> datetime:
    return datetime.now(UTC)


def unlocked(now: datetime):
    """No dispatch holds the delivery (never locked, or the lock ran out)."""
    return or_(WebhookDelivery.locked_until.is_(None), WebhookDelivery.locked_until <= now)


def parse_delivery_id(public_id: str) -> int | None:
    """``whd_<n>`` as the API shows it, or None for anything else (never sent to the
    database: a number past the column's range would be an error there, not a miss)."""
    digits = public_id.removeprefix(DELIVERY_PREFIX)
    if public_id.startswith(DELIVERY_PREFIX) and digits.isascii() and digits.isdigit() \
            and len(digits) <= 10 and int(digits) <= MAX_ID:
        return int(digits)
    return None


def _log(s: Session, rows) -> list[DeliveryLogRecord]:
    attempts: dict[int, list[AttemptRecord]] = {}
    for a in s.scalars(select(WebhookAttempt).where(WebhookAttempt.delivery_id.in_(
            [d.id for d, _ in rows])).order_by(WebhookAttempt.id)):
        attempts.setdefault(a.delivery_id, []).append(AttemptRecord(
            attempted_at=a.attempted_at, url_host=a.url_host, status_code=a.status_code,
            error=a.error, duration_ms=a.duration_ms, next_attempt_at=a.next_attempt_at))
    return [DeliveryLogRecord(
        id=d.id, event_id=e.id, event_type=e.type, endpoint_id=d.endpoint_id,
        status=d.status, next_attempt_at=d.next_attempt_at, created_at=d.created_at,
        attempts=tuple(attempts.get(d.id, ())), job_id=e.job_id, tenant_id=e.tenant_id)
        for d, e in rows]


def _with_events():
    return select(WebhookDelivery, WebhookEvent).join(
        WebhookEvent, WebhookEvent.id == WebhookDelivery.event_id)


def for_job(s: Session, tenant_id: str | None, job_id: str) -> list[DeliveryLogRecord]:
    rows = s.execute(_with_events().where(
        WebhookEvent.job_id == job_id, tenant_is(WebhookEvent.tenant_id, tenant_id))
        .order_by(WebhookDelivery.id)).all()
    return _log(s, rows)


def for_endpoint(s: Session, tenant_id: str | None, endpoint_id: str, limit: int
                 ) -> list[DeliveryLogRecord]:
    """The endpoint's latest deliveries, newest first."""
    rows = s.execute(_with_events().where(
        WebhookDelivery.endpoint_id == endpoint_id,
        tenant_is(WebhookEvent.tenant_id, tenant_id))
        .order_by(WebhookDelivery.id.desc()).limit(limit)).all()
    return _log(s, rows)


def failure_rates(s: Session, endpoint_ids: list[str], since: datetime
                  ) -> dict[str, tuple[int, int]]:
    """Per endpoint, (attempts, failed attempts) since ``since``: an attempt failed when
    it got no answer or an answer outside 2xx."""
    failed = or_(WebhookAttempt.status_code.is_(None), WebhookAttempt.status_code < 200,
                 WebhookAttempt.status_code >= 300)
    rows = s.execute(select(WebhookDelivery.endpoint_id, func.count(),
                            func.count().filter(failed)).join(
        WebhookDelivery, WebhookDelivery.id == WebhookAttempt.delivery_id).where(
        WebhookDelivery.endpoint_id.in_(endpoint_ids), WebhookAttempt.attempted_at >= since)
        .group_by(WebhookDelivery.endpoint_id)).all()
    return {endpoint: (total, bad) for endpoint, total, bad in rows}


def _refuse_stopped_target(s: Session, d: WebhookDelivery) -> None:
    if d.endpoint_id is not None:
        disabled = s.scalar(select(WebhookEndpoint.disabled_at).where(
            WebhookEndpoint.id == d.endpoint_id))
        if disabled is not None:
            raise Conflict(f"the endpoint {d.endpoint_id} is disabled (its receiver answered "
                           "410 Gone); update it to enable it, then replay",
                           code="webhook_endpoint_disabled")
        return
    stopped = s.scalar(select(JobWebhook.stopped_at).where(JobWebhook.job_id == d.target))
    if stopped is not None:
        raise Conflict("this job's webhook_url answered 410 Gone; nothing more is sent to it",
                       code="webhook_url_stopped")


def replay(s: Session, tenant_id: str | None, delivery: int) -> DeliveryLogRecord | None:
    """Put the delivery back on the schedule, due now (None: no such delivery of this
    tenant). A replay is one more attempt: one that fails is retried only while the
    delivery's retry schedule has attempts left. One being sent right now is a 409."""
    row = s.execute(_with_events().where(WebhookDelivery.id == delivery, tenant_is(
        WebhookEvent.tenant_id, tenant_id))).first()
    if row is None:
        return None
    d, _event = row
    _refuse_stopped_target(s, d)
    now = _now()
    replayed = s.execute(update(WebhookDelivery).where(
        WebhookDelivery.id == d.id, WebhookDelivery.status == d.status, unlocked(now)).values(
        status=PENDING, next_attempt_at=now, lock_token=None, locked_until=None,
        updated_at=now)).rowcount == 1
    if not replayed:
        raise Conflict(f"delivery {DELIVERY_PREFIX}{d.id} is being sent right now; replay it "
                       "once this attempt is recorded", code="webhook_delivery_in_flight")
    s.expire_all()
    return _log(s, s.execute(_with_events().where(WebhookDelivery.id == d.id)).all())[0]


def recent_window() -> datetime:
    """The failure rate's window: the last 24 hours."""
    return _now() - timedelta(hours=24)

