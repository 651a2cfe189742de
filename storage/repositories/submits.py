"""Group commit: many submits' jobs and render messages in one transaction.

Under load, an API process gathers the submits that arrive while its previous group is
being written and inserts them together: one multi-row INSERT for the jobs, one for
their outbox messages, one commit. Each job is still committed with its message before
its caller hears 202, so durability is the single-submit path's; only the round trips
and the commit are shared. A job refused by the quotas is refused alone (the others of
its group are unaffected). Submits with an idempotency key take the single path, whose
unique-constraint race needs a transaction of its own.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

from sqlalchemy import insert
from sqlalchemy.orm import Session, sessionmaker

from core.errors import TooManyRequests
from core.jobs import JobKind, JobStatus

from ..models import Job, JobWebhook, OutboxMessage
from ..records import JobRecord, NewJob, OutboxRecord
from .outbox import new_token
from .quotas import Quotas

ID_PREFIX = {JobKind.SPEECH: "job_", JobKind.VIDEO: "video_"}
JOBS, OUTBOX = Job.__table__, OutboxMessage.__table__
Submitted = tuple[JobRecord, OutboxRecord] | TooManyRequests


def insert_many(sessions: sessionmaker[Session], quotas: Quotas | None,
                news: Sequence[NewJob]) -> list[Submitted]:
    """Insert every admitted job with its render message, all in one transaction; per
    job, its records or the quota's refusal, in the order given."""
    if any(n.idempotency_key is not None for n in news):
        raise ValueError("submits with an idempotency key take JobRepository.create")
    now = datetime.now(UTC)
    with sessions.begin() as s:
        refusals = quotas.admit_many(s, news) if quotas is not None else [None] * len(news)
        admitted = [(n, _job_row(n, now)) for n, r in zip(news, refusals, strict=True) if r is None]
        if admitted:
            # Core inserts of the tables (no unit of work): one multi-row INSERT each.
            s.execute(insert(JOBS), [row for _, row in admitted])
            hooks = [{"job_id": row["id"], "url": n.webhook.url,
                      "event_types": list(n.webhook.event_types)}
                     for n, row in admitted if n.webhook is not None]
            if hooks:
                s.execute(insert(JobWebhook.__table__), hooks)
            messages = [_message_row(n, row, now) for n, row in admitted]
            ids = s.scalars(insert(OUTBOX).returning(
                OUTBOX.c.id, sort_by_parameter_order=True), messages).all()
    done = iter(zip(admitted, ids, strict=True) if admitted else ())
    out: list[Submitted] = []
    for refusal in refusals:
        if refusal is not None:
            out.append(refusal)
            continue
        (new, row), msg_id = next(done)
        out.append((_job_record(new, row), OutboxRecord(
            id=msg_id, topic="render", job_id=row["id"], queue=new.queue,
            payload={"job_id": row["id"], "token": row["dispatch_token"]},
            available_at=now)))
    return out


def _job_row(new: NewJob, now: datetime) -> dict:
    return {"id": ID_PREFIX[new.kind] + uuid.uuid4().hex, "tenant_id": new.tenant_id,
            "kind": new.kind.value, "model": new.model, "pipeline": new.pipeline,
            "status": JobStatus.QUEUED.value, "progress": 0, "request": new.request,
            "metadata": new.metadata, "idempotency_key": None, "attempts": 0,
            "max_attempts": new.max_attempts, "created_at": now, "updated_at": now,
            "dispatch_token": new_token()}


def _message_row(new: NewJob, row: dict, now: datetime) -> dict:
    return {"topic": "render", "job_id": row["id"], "queue": new.queue,
            "payload": {"job_id": row["id"], "token": row["dispatch_token"]},
            "created_at": now, "available_at": now}


def _job_record(new: NewJob, row: dict) -> JobRecord:
    return JobRecord(
        id=row["id"], tenant_id=new.tenant_id, kind=new.kind, model=new.model,
        pipeline=new.pipeline, status=JobStatus.QUEUED, progress=0, request=dict(new.request),
        metadata=new.metadata, attempts=0, max_attempts=new.max_attempts, error_code=None,
        error_message=None, created_at=row["created_at"], updated_at=row["updated_at"],
        started_at=None, completed_at=None, lease_expires_at=None,
        dispatch_token=row["dispatch_token"])
