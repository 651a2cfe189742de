"""Webhooks: endpoints, signing secrets, per-job URLs, events and their deliveries.

Events are staged inside the job transition they report (``stage_job_event``, called by
the job repository in its own transaction), so an event exists exactly when its
transition committed. Deliveries are rows with a schedule (``next_attempt_at``) and a
lock (``lock_token`` + ``locked_until``): the scheduler locks due ones and hands them to
delivery tasks; a lock that expires (a killed worker) is simply dispatched again.
"""

from __future__ import annotations

import base64
import re
import secrets
import uuid
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

from sqlalchemy import bindparam, delete, func, literal, select, union_all, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from core.errors import InvalidRequest

from ..models import (
    Job,
    JobWebhook,
    Tenant,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEvent,
    WebhookSecret,
)
from ..records import (
    AttemptRecord,
    DeliveryLogRecord,
    DeliveryWork,
    EndpointRecord,
    JobWebhookRequest,
    SecretRecord,
)
from . import webhook_log
from .scope import tenant_is
from .webhook_log import FAILED, PENDING, STOPPED, SUCCEEDED, unlocked  # noqa: F401 (statuses)

JOB_EVENTS = ("started", "completed", "failed", "cancelled")
EVENT_TYPES = (*(f"{kind}.{e}" for kind in ("speech", "video") for e in JOB_EVENTS),
               "batch.completed", "batch.failed", "batch.cancelled", "batch.expired")
ROTATION_GRACE = timedelta(hours=24)
# Endpoint ids are minted here ("we_" + a UUID's hex); anything else names no endpoint and
# is never sent to the database (where a NUL byte is an error rather than a miss).
ENDPOINT_ID = re.compile(r"we_[0-9a-f]{32}")

def _now() -> datetime:
    return datetime.now(UTC)


def default_events(kind: str) -> tuple[str, ...]:
    """What a subscription gets unless it asks otherwise: the terminal events."""
    return tuple(f"{kind}.{e}" for e in JOB_EVENTS if e != "started")


def new_secret() -> str:
    """Standard Webhooks' form: ``whsec_`` + base64 of 32 random bytes."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def new_event_id() -> str:
    return "evt_" + uuid.uuid4().hex


def url_host(url: str) -> str:
    return urlsplit(url).netloc.rpartition("@")[2][:300]


# ---- staged inside the job repository's transactions ---------------------------------

def subscribe_job(s: Session, job_id: str, hook: JobWebhookRequest | None) -> None:
    if hook is not None:
        s.add(JobWebhook(job_id=job_id, url=hook.url, event_types=list(hook.event_types)))


# The job's own subscription and the tenant's endpoints, in one round trip: built once
# (every claim and completion runs it), with the job and tenant bound per call.
_TARGETS = union_all(
    select(literal(False).label("endpoint"), JobWebhook.url.label("target"),
           JobWebhook.event_types).where(JobWebhook.job_id == bindparam("job_id"),
                                         JobWebhook.stopped_at.is_(None)),
    select(literal(True), WebhookEndpoint.id, WebhookEndpoint.event_types).where(
        WebhookEndpoint.tenant_id == bindparam("tenant_id"),
        WebhookEndpoint.disabled_at.is_(None)))


def stage_job_event(s: Session, job_id: str, event: str, job: Job | None = None) -> None:
    """Write the event and one delivery per interested target, in the caller's
    transaction. ``started`` is reported for the first attempt only. A batch's jobs have
    no events of their own: their batch's event reports them. ``job``: the row as the
    caller's transaction already has it (saves reading it again)."""
    if job is None:
        job = s.execute(select(Job.tenant_id, Job.kind, Job.attempts, Job.batch_id).where(
            Job.id == job_id)).first()
    if job is None or job.batch_id is not None or (event == "started" and job.attempts > 1):
        return
    event_type = f"{job.kind}.{event}"
    rows = s.execute(_TARGETS, {"job_id": job_id, "tenant_id": job.tenant_id}).all()
    targets: list[tuple[str | None, str | None, str]] = [  # (endpoint, url, target)
        (target, None, target) if endpoint else (None, target, job_id)
        for endpoint, target, types in rows if event_type in types]
    _stage(s, job.tenant_id, job_id, event_type, targets, endpoints_known=True)


def withdraw_event(s: Session, job_id: str, event_type: str) -> None:
    """Remove a job's event none of whose deliveries has been tried yet, in the caller's
    transaction (a claim's ``started`` for a job that then expired without running). A
    delivery already attempted stays: what was sent cannot be unsent."""
    tried = select(WebhookDelivery.id).where(WebhookDelivery.event_id == WebhookEvent.id,
                                             WebhookDelivery.attempts > 0)
    ids = s.scalars(select(WebhookEvent.id).where(
        WebhookEvent.job_id == job_id, WebhookEvent.type == event_type,
        ~tried.exists())).all()
    if ids:
        s.execute(delete(WebhookDelivery).where(WebhookDelivery.event_id.in_(ids)))
        s.execute(delete(WebhookEvent).where(WebhookEvent.id.in_(ids)))


def stage_batch_event(s: Session, tenant_id: str, batch_id: str, event_type: str) -> None:
    """A ``batch.*`` event for the tenant's registered endpoints, in the caller's
    transaction (the batch's terminal transition). ``job_id`` holds the batch's id."""
    _stage(s, tenant_id, batch_id, event_type, [])


def _stage(s: Session, tenant_id: str, subject_id: str, event_type: str,
           targets: list[tuple[str | None, str | None, str]],
           endpoints_known: bool = False) -> None:
    """``targets`` plus, unless ``endpoints_known``, the tenant's interested endpoints."""
    if not endpoints_known:
        for endpoint_id, types in s.execute(select(
                WebhookEndpoint.id, WebhookEndpoint.event_types).where(
                WebhookEndpoint.tenant_id == tenant_id, WebhookEndpoint.disabled_at.is_(None))):
            if event_type in types:
                targets.append((endpoint_id, None, endpoint_id))
    if not targets:
        return
    now = _now()
    evt = WebhookEvent(id=new_event_id(), tenant_id=tenant_id, job_id=subject_id,
                       type=event_type, created_at=now)
    s.add(evt)
    s.flush()
    s.add_all(WebhookDelivery(event_id=evt.id, endpoint_id=endpoint_id, url=url, target=target,
                              status=PENDING, attempts=0, next_attempt_at=now, created_at=now,
                              updated_at=now)
              for endpoint_id, url, target in targets)


def _endpoint_record(e: WebhookEndpoint, secret: str) -> EndpointRecord:
    return EndpointRecord(id=e.id, tenant_id=e.tenant_id, name=e.name, url=e.url,
                          event_types=tuple(e.event_types), created_at=e.created_at,
                          updated_at=e.updated_at, disabled_at=e.disabled_at,
                          secret_hint=f"whsec_...{secret[-4:]}")


def _secret_record(row: WebhookSecret) -> SecretRecord:
    return SecretRecord(secret=row.secret, created_at=row.created_at,
                        previous_secret=row.previous_secret,
                        previous_expires_at=row.previous_expires_at)


class WebhookRepository:
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

    # ---- deliveries ------------------------------------------------------------------

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
