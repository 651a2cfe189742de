"""Group commit: many submits' jobs and render messages in one transaction.

Under load, an API process gathers the submits that arrive while its previous group is
being written and inserts them together: one multi-row INSERT for the jobs, one for
their outbox messages, one commit. Each job is still committed with its message before
its caller hears 202, so durability is the single-submit path's; only the round trips
and the commit are shared. A job refused by the quotas is refused alone (the others of
its group are unaffected), and so is one whose row the database refuses (a data error:
the group is written again row by row, and only that row fails). Submits with an
idempotency key take the single path, whose unique-constraint race needs a transaction
of its own.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from functools import partial

from sqlalchemy import Engine, insert
from sqlalchemy.exc import DataError, IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from core.errors import InvalidRequest, OmniJobsError
from core.jobs import JobKind, JobStatus

from ..models import Job, JobWebhook, OutboxMessage
from ..records import JobRecord, NewJob, OutboxRecord
from .outbox import new_token
from .quotas import Quotas

ID_PREFIX = {JobKind.SPEECH: "job_", JobKind.VIDEO: "video_"}


def new_job_id(kind: JobKind) -> str:
    return ID_PREFIX[kind] + uuid.uuid4().hex

JOBS, OUTBOX = Job.__table__, OutboxMessage.__table__
Submitted = tuple[JobRecord, OutboxRecord] | OmniJobsError | IntegrityError
# What one bad row raises for the whole statement (a NUL in a text column, a value too
# long, a vanished tenant): the group is retried row by row.
ROW_ERRORS = (DataError, IntegrityError)

log = logging.getLogger(__name__)


def insert_many(sessions: sessionmaker[Session], quotas: Quotas | None,
                news: Sequence[NewJob]) -> list[Submitted]:
    """Insert every admitted job with its render message, all in one transaction; per
    job, its records or the quota's refusal, in the order given. A row the database
    refuses fails alone: the group is then written one row per transaction, and that
    row's answer is a 400 (a data error) or the error itself."""
    if any(n.idempotency_key is not None for n in news):
        raise ValueError("submits with an idempotency key take JobRepository.create")
    try:
        return _insert_group(sessions, quotas, news)
    except ROW_ERRORS as exc:
        if len(news) > 1:
            log.warning("a group of %d submits hit %s; written again row by row",
                        len(news), type(exc).__name__)
            return [r for new in news for r in insert_many(sessions, quotas, [new])]
        if isinstance(exc, IntegrityError):
            return [exc]
        log.warning("a submit's row was refused by the database: %s", type(exc.orig).__name__)
        return [InvalidRequest("the request holds a value that cannot be stored",
                               code="invalid_value")]


def _insert_group(sessions: sessionmaker[Session], quotas: Quotas | None,
                  news: Sequence[NewJob]) -> list[Submitted]:
    now = datetime.now(UTC)
    engine = sessions.kw["bind"]
    refusals = (quotas.admit_many(partial(_read, engine), news) if quotas is not None
                else [None] * len(news))
    admitted = [(n, _job_row(n, now)) for n, r in zip(news, refusals, strict=True) if r is None]
    if admitted:
        hooks = [{"job_id": row["id"], "url": n.webhook.url,
                  "event_types": list(n.webhook.event_types)}
                 for n, row in admitted if n.webhook is not None]
        messages = [_message_row(n, row, now) for n, row in admitted]
        jobs = [row for _, row in admitted]
        if engine.dialect.name == "postgresql":
            ids = _insert_pg(engine, jobs, hooks, messages, now)
        else:
            with sessions.begin() as s:
                ids = _insert_core(s, jobs, hooks, messages, now)
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


def _read(engine: Engine, statement, params: dict):
    """The quotas' counts: one statement on its own (no transaction to begin and end).
    Counting inside the insert's transaction would serialise nothing more: under READ
    COMMITTED two submits racing at a cap may both pass either way."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        return conn.execute(statement, params).one()


def _insert_core(s: Session, jobs: list[dict], hooks: list[dict], messages: list[dict],
                 now: datetime) -> list[int]:
    """Core inserts of the tables (no unit of work): one multi-row INSERT each; the
    outbox ids in the messages' order."""
    s.execute(insert(JOBS), jobs)
    if hooks:
        s.execute(insert(JobWebhook.__table__), hooks)
    return s.scalars(insert(OUTBOX).returning(OUTBOX.c.id, sort_by_parameter_order=True),
                     messages).all()


# PostgreSQL: each table's rows as one array per column, unnested by one statement whose
# text never changes, so neither SQLAlchemy nor psycopg builds or parses a statement per
# group (a multi-row VALUES list is new text for every group size, and too long for
# psycopg's parse cache): at a few hundred submits a second that was a quarter of the
# writer thread's CPU. The jobs, their webhooks and their messages are one statement run
# on its own: atomic as a transaction, one round trip instead of five.
_PG_INSERT = (
    "WITH j AS (INSERT INTO jobs (id, tenant_id, kind, model, pipeline, status, progress, "
    "request, metadata, idempotency_key, attempts, max_attempts, created_at, updated_at, "
    "dispatch_token) SELECT id, tenant_id, kind, model, pipeline, %(status)s, 0, "
    "request::json, metadata::json, NULL, 0, max_attempts, %(now)s, %(now)s, token "
    "FROM unnest(%(id)s::text[], %(tenant_id)s::text[], %(kind)s::text[], %(model)s::text[], "
    "%(pipeline)s::text[], %(request)s::text[], %(metadata)s::text[], "
    "%(max_attempts)s::int[], %(token)s::text[]) "
    "AS t(id, tenant_id, kind, model, pipeline, request, metadata, max_attempts, token) "
    "RETURNING id), "
    "h AS (INSERT INTO job_webhooks (job_id, url, event_types) "
    "SELECT job_id, url, event_types::json FROM unnest(%(hook_job)s::text[], "
    "%(hook_url)s::text[], %(hook_events)s::text[]) AS w(job_id, url, event_types) "
    "RETURNING job_id) "
    "INSERT INTO outbox (topic, job_id, queue, payload, created_at, available_at) "
    "SELECT 'render', job_id, queue, payload::json, %(now)s, %(now)s "
    "FROM unnest(%(job_id)s::text[], %(queue)s::text[], %(payload)s::text[]) "
    "AS t(job_id, queue, payload) RETURNING job_id, id")


def _insert_pg(engine: Engine, jobs: list[dict], hooks: list[dict], messages: list[dict],
               now: datetime) -> list[int]:
    # Through SQLAlchemy's connection, not a bare cursor: its errors (an outage is a 503)
    # and the pool's invalidation of a dead connection stay as on every other statement.
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        ids = dict(conn.exec_driver_sql(_PG_INSERT, {
            "status": JobStatus.QUEUED.value, "now": now,
            "id": [j["id"] for j in jobs], "tenant_id": [j["tenant_id"] for j in jobs],
            "kind": [j["kind"] for j in jobs], "model": [j["model"] for j in jobs],
            "pipeline": [j["pipeline"] for j in jobs],
            "request": [json.dumps(j["request"]) for j in jobs],
            "metadata": [json.dumps(j["metadata"]) for j in jobs],  # None: JSON null
            "max_attempts": [j["max_attempts"] for j in jobs],
            "token": [j["dispatch_token"] for j in jobs],
            "hook_job": [h["job_id"] for h in hooks], "hook_url": [h["url"] for h in hooks],
            "hook_events": [json.dumps(h["event_types"]) for h in hooks],
            "job_id": [m["job_id"] for m in messages], "queue": [m["queue"] for m in messages],
            "payload": [json.dumps(m["payload"]) for m in messages]}).all())
    # RETURNING's order is not promised: the ids are matched by job
    return [ids[m["job_id"]] for m in messages]


def _job_row(new: NewJob, now: datetime) -> dict:
    return {"id": new.id or new_job_id(new.kind), "tenant_id": new.tenant_id,
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
