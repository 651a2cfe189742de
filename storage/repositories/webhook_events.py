"""Webhook events, staged inside the transitions they report.

Events are staged inside the job transition they report (``stage_job_event``, called by
the job repository in its own transaction), so an event exists exactly when its
transition committed: an event and one pending delivery per interested target (the job's
own URL, the tenant's endpoints), due at once.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from sqlalchemy import bindparam, delete, literal, select, union_all
from sqlalchemy.orm import Session

from ..models import Job, JobWebhook, WebhookDelivery, WebhookEndpoint, WebhookEvent
from ..records import JobWebhookRequest
from .webhook_log import PENDING

JOB_EVENTS = ("started", "completed", "failed", "cancelled")
EVENT_TYPES = (*(f"{kind}.{e}" for kind in ("speech", "video") for e in JOB_EVENTS),
               "batch.completed", "batch.failed", "batch.cancelled", "batch.expired")


def _now() -> datetime:
    return datetime.now(UTC)


def default_events(kind: str) -> tuple[str, ...]:
    """What a subscription gets unless it asks otherwise: the terminal events."""
    return tuple(f"{kind}.{e}" for e in JOB_EVENTS if e != "started")


def new_event_id() -> str:
    return "evt_" + uuid.uuid4().hex


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
