"""The outbox: messages committed with the state they announce, published after."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from core.batches import BULK_LANE

from ..models import Job, OutboxMessage
from ..records import OutboxRecord


def new_token() -> str:
    """A job's dispatch token: only a render message carrying the job's current token may
    claim it, so a superseded copy (re-sent, redelivered, restored by the broker) is a
    no-op."""
    return uuid.uuid4().hex


def add_render(s: Session, job_id: str, queue: str, token: str,
               delay_s: float = 0.0) -> OutboxMessage:
    """Stage the render message carrying ``token`` (which the caller has just written on
    the job) inside the caller's transaction."""
    return add_message(s, topic="render", job_id=job_id, queue=queue,
                       payload={"job_id": job_id, "token": token}, delay_s=delay_s)


def add_message(s: Session, *, topic: str, job_id: str, queue: str, payload: dict,
                delay_s: float = 0.0) -> OutboxMessage:
    """Stage a message inside the caller's transaction (used by the job repository). A
    batch job's render message keeps the bulk lane, whoever re-sends it."""
    now = datetime.now(UTC)
    if topic == "render" and "lane" not in payload and _in_batch(s, job_id):
        payload = {**payload, "lane": BULK_LANE}
    msg = OutboxMessage(topic=topic, job_id=job_id, queue=queue, payload=payload,
                        created_at=now, available_at=now + timedelta(seconds=delay_s))
    s.add(msg)
    s.flush()
    return msg


def _in_batch(s: Session, job_id: str) -> bool:
    job = s.get(Job, job_id)  # the identity map has it when the job was just added
    return job is not None and job.batch_id is not None


def _record(m: OutboxMessage) -> OutboxRecord:
    return OutboxRecord(id=m.id, topic=m.topic, job_id=m.job_id, queue=m.queue,
                        payload=dict(m.payload), available_at=m.available_at)


class OutboxRepository:
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    def due(self, *, grace_s: float, limit: int = 100,
            interactive_only: bool = False) -> list[OutboxRecord]:
        """Unpublished messages that are due and older than ``grace_s``, oldest first;
        with ``interactive_only``, those outside the bulk lane (a batch job's message
        carries its lane), which the relay sends before a batch's backlog.

        The grace period leaves the submitting process time to publish its own
        message first; a message published twice is harmless (claims are CAS).
        """
        now = datetime.now(UTC)
        query = select(OutboxMessage).where(
            OutboxMessage.published_at.is_(None),
            OutboxMessage.available_at <= now,
            OutboxMessage.created_at <= now - timedelta(seconds=grace_s),
        )
        if interactive_only:
            lane = OutboxMessage.payload["lane"].as_string()
            query = query.where(or_(lane.is_(None), lane != BULK_LANE))
        with self._sessions() as s:
            rows = s.scalars(query.order_by(OutboxMessage.id).limit(limit)).all()
            return [_record(m) for m in rows]

    def mark_published(self, ids: list[int]) -> None:
        if not ids:
            return
        with self._sessions.begin() as s:
            s.execute(update(OutboxMessage).where(OutboxMessage.id.in_(ids))
                      .values(published_at=datetime.now(UTC)))

    def prune(self, older_than_s: float) -> int:
        """Delete messages published more than ``older_than_s`` ago: they did their work."""
        cutoff = datetime.now(UTC) - timedelta(seconds=older_than_s)
        with self._sessions.begin() as s:
            return s.execute(delete(OutboxMessage).where(
                OutboxMessage.published_at < cutoff)).rowcount

    def for_job(self, job_id: str) -> list[OutboxRecord]:
        with self._sessions() as s:
            rows = s.scalars(select(OutboxMessage).where(OutboxMessage.job_id == job_id)
                             .order_by(OutboxMessage.id)).all()
            return [_record(m) for m in rows]

