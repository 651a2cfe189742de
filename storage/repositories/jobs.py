"""Jobs and their outputs. Every status change is one compare-and-set UPDATE here.

``WHERE id = ? AND status = ?`` (plus the attempt number for a worker's writes) means
a second worker, a late duplicate message or a worker whose lease was reclaimed
loses the race and changes nothing.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, delete, func, literal, or_, select, tuple_, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, joinedload, sessionmaker

from core.errors import MESSAGE_LIMIT, InvalidRequest, TooManyRequests
from core.jobs import TERMINAL, JobKind, JobStatus

from ..models import OUTPUTS_KEPT, QUEUED, Job, OutboxMessage, Output, UTCDateTime
from ..records import (
    MAIN,
    JobAttemptRecord,
    JobFilter,
    JobObjects,
    JobRecord,
    NewJob,
    OutboxRecord,
    OutputRecord,
)
from . import attempts as history
from . import fair, hotpath
from . import usage as metering
from .outbox import _record as outbox_record
from .outbox import add_render, new_token
from .quotas import Quotas
from .submits import Submitted, insert_many, new_job_id
from .webhooks import new_event_id, stage_job_event, subscribe_job, withdraw_event


def _now() -> datetime:
    return datetime.now(UTC)


def _output(o: Output) -> OutputRecord:
    return OutputRecord(
        index=o.index, key=o.key, content_type=o.content_type, bytes=o.bytes,
        sha256=o.sha256, duration_s=o.duration_s, sample_rate=o.sample_rate,
        channels=o.channels, width=o.width, height=o.height, fps=o.fps, frames=o.frames,
        variant=o.variant)


def _record(j: Job, outputs: tuple[OutputRecord, ...] | None = None) -> JobRecord:
    """``outputs``: given when the caller knows them (a claimed job has none), so the
    relationship is not loaded for nothing. A video's previews are rows of their own."""
    rows = outputs if outputs is not None else tuple(_output(o) for o in j.outputs)
    return JobRecord(
        id=j.id, tenant_id=j.tenant_id, kind=JobKind(j.kind), model=j.model,
        pipeline=j.pipeline, status=JobStatus(j.status), progress=j.progress,
        request=dict(j.request), metadata=j.metadata_, attempts=j.attempts,
        max_attempts=j.max_attempts, error_code=j.error_code, error_message=j.error_message,
        created_at=j.created_at, updated_at=j.updated_at, started_at=j.started_at,
        completed_at=j.completed_at, lease_expires_at=j.lease_expires_at,
        idempotency_key=j.idempotency_key, dispatch_token=j.dispatch_token,
        expires_at=j.expires_at, outputs_deleted_at=j.outputs_deleted_at,
        start_by=j.start_by, max_run_s=j.max_run_s, batch_id=j.batch_id, ready_at=j.ready_at,
        usage=metering.record(getattr(j, "usage", None)),  # a claimed row has none
        outputs=tuple(sorted((o for o in rows if o.variant == MAIN), key=lambda o: o.index)),
        previews=tuple(o for o in rows if o.variant != MAIN),
    )


def _after(s: Session, tenant_id: str | None, after: str, order: str):
    """The rows past the cursor. An unknown (or deleted) cursor is an error, never a
    restart at page one: a client paging through would loop."""
    q = select(Job.created_at, Job.id).where(Job.id == after)
    cursor = s.execute(q if tenant_id is None else q.where(Job.tenant_id == tenant_id)).first()
    if cursor is None:
        raise InvalidRequest("'after' is not a job of this list (unknown or deleted)",
                             param="after", code="invalid_cursor")
    # A row-value comparison (PostgreSQL; SQLite since 3.15): a range of the
    # (tenant_id, created_at, id) index, where page k starts at once. Spelled as
    # ``a < c OR (a = c AND b < i)`` it is a filter, and page k reads the k-1 before it.
    key, at = tuple_(Job.created_at, Job.id), tuple_(
        literal(cursor[0], UTCDateTime()), literal(cursor[1], Job.id.type))
    return key < at if order == "desc" else key > at


def _filtered(q, f: JobFilter):
    """The list's ``WHERE``: one place, whoever lists (the API's routes, the console)."""
    if f.tenant_id is not None:
        q = q.where(Job.tenant_id == f.tenant_id)
    for value, column in ((f.status, Job.status), (f.kind, Job.kind), (f.model, Job.model),
                          (f.batch_id, Job.batch_id)):
        if value is not None:
            q = q.where(column == str(value))
    if f.created_after is not None:
        q = q.where(Job.created_at >= f.created_after)
    if f.created_before is not None:
        q = q.where(Job.created_at < f.created_before)
    return q


def cancel_batch_jobs(s: Session, batch_id: str, now: datetime,
                      status: JobStatus = JobStatus.CANCELLED) -> int:
    """queued|running -> cancelled (or ``expired``: the batch's window passed) for every
    unfinished job of a batch, in one statement of the caller's transaction (a running
    job's worker stops at its next heartbeat, and reports its time then). The batch's own
    event reports it; no per-job events. The jobs first, then their open attempts: the
    order a worker's transitions lock them in, so the two never deadlock."""
    cancelled = s.execute(update(Job).where(
        Job.batch_id == batch_id,
        Job.status.in_([JobStatus.QUEUED.value, JobStatus.RUNNING.value])).values(
        status=status.value, completed_at=now, updated_at=now,
        lease_expires_at=None)).rowcount
    history.close_batch_attempts(s, batch_id, now)
    return cancelled


def _ended_event(kind: str, status: JobStatus) -> str:
    """The webhook event of a job that ended by a deadline: a video reports what
    ``/v1/videos`` shows (``failed``); speech its own status where an event has it."""
    if kind == JobKind.VIDEO.value or status is JobStatus.EXPIRED:
        return "failed"
    return status.value


def _claim_statement(with_token: bool):
    """queued -> running for ``:job_id`` (with ``:token``, only for the job's current
    dispatch token), returning the row: built once, run with parameters."""
    q = update(Job).where(Job.id == bindparam("job_id"),
                          Job.status == JobStatus.QUEUED.value)
    if with_token:
        q = q.where(Job.dispatch_token == bindparam("token"))
    return q.values(
        status=JobStatus.RUNNING.value, attempts=Job.attempts + 1,
        worker_id=bindparam("worker_id"), lease_expires_at=bindparam("lease", type_=UTCDateTime()),
        updated_at=bindparam("now", type_=UTCDateTime()),
        started_at=func.coalesce(Job.started_at, bindparam("now", type_=UTCDateTime())),
        error_code=None, error_message=None).returning(*fair.CLAIMED)


_CLAIM = (_claim_statement(False), _claim_statement(True))
_FAIR_CLAIM = {lane: fair.claim_statement(lane, fair.CLAIMED) for lane in fair.LANES}


def _heartbeat_statement(with_progress: bool):
    """Extend the lease of ``:job_id`` while it is running attempt ``:attempt`` (and set
    ``:new_progress``): built once, like the claim; a worker sends one every few seconds
    and one before each upload."""
    q = update(Job).where(Job.id == bindparam("job_id"),
                          Job.status == JobStatus.RUNNING.value,
                          Job.attempts == bindparam("attempt")).values(
        lease_expires_at=bindparam("lease", type_=UTCDateTime()),
        updated_at=bindparam("now", type_=UTCDateTime()))
    return q.values(progress=bindparam("new_progress")) if with_progress else q


_HEARTBEAT = (_heartbeat_statement(False), _heartbeat_statement(True))


class JobRepository:
    def __init__(self, sessions: sessionmaker[Session], quotas: Quotas | None = None) -> None:
        self._sessions = sessions
        self._engine = sessions.kw["bind"]
        self._dialect = self._engine.dialect.name  # PostgreSQL: the one-statement paths
        # Reads that are one statement run on their own: no BEGIN before and no ROLLBACK
        # after (two round trips of three), for the reads every watcher makes.
        self._reads = sessionmaker(self._engine.execution_options(isolation_level="AUTOCOMMIT"),
                                   expire_on_commit=False)
        self._quotas = quotas  # admission for submits (the API's); None: no limits

    # ---- submit and read -------------------------------------------------------------

    def create(self, new: NewJob) -> tuple[JobRecord, OutboxRecord | None]:
        """Insert the job and its render message in one transaction.

        With an idempotency key already used by the tenant, returns the existing job
        and no message (nothing new to publish), even when the quotas are full.
        """
        now = _now()
        job = Job(id=new.id or new_job_id(new.kind), tenant_id=new.tenant_id,
                  kind=new.kind.value, model=new.model, pipeline=new.pipeline,
                  status=JobStatus.QUEUED.value, progress=0, request=new.request,
                  metadata_=new.metadata, idempotency_key=new.idempotency_key, attempts=0,
                  max_attempts=new.max_attempts, created_at=now, updated_at=now,
                  dispatch_token=new_token(), start_by=new.start_by, max_run_s=new.max_run_s)
        try:
            with self._sessions.begin() as s:
                if self._quotas is not None:
                    self._quotas.admit(s, tenant_id=new.tenant_id, lane=new.lane,
                                       pipeline=new.pipeline)
                s.add(job)
                s.flush()
                subscribe_job(s, job.id, new.webhook)
                msg = add_render(s, job.id, new.queue, job.dispatch_token)
                return _record(job), outbox_record(msg)
        except (IntegrityError, TooManyRequests):
            if new.idempotency_key is None:
                raise
            existing = self.get_by_idempotency_key(new.tenant_id, new.idempotency_key)
            if existing is None:
                raise
            return existing, None

    def create_many(self, news: list[NewJob]) -> list[Submitted]:
        """Group commit of submits without idempotency keys (``submits.insert_many``)."""
        return insert_many(self._sessions, self._quotas, news)

    def get_by_idempotency_key(self, tenant_id: str, key: str) -> JobRecord | None:
        return self._one(select(Job).where(Job.tenant_id == tenant_id,
                                           Job.idempotency_key == key))

    def get(self, job_id: str, tenant_id: str | None = None) -> JobRecord | None:
        q = select(Job).where(Job.id == job_id)
        return self._one(q if tenant_id is None else q.where(Job.tenant_id == tenant_id))

    def _one(self, q) -> JobRecord | None:
        """One job with its outputs and usage record, in one statement (joined, not the
        relationships' own ``selectin`` reads)."""
        with self._reads() as s:
            j = s.execute(q.options(joinedload(Job.outputs), joinedload(Job.usage))
                          ).unique().scalar_one_or_none()
            return _record(j) if j else None

    def states(self, job_ids: list[str]) -> dict[str, tuple[str, int, int]]:
        """(status, attempts, progress) of each job that exists: all an API process's
        watchers need to tell whether their job changed, in one query for all of them
        (the live resync, api/live.py)."""
        if not job_ids:
            return {}
        with self._reads() as s:
            rows = s.execute(select(Job.id, Job.status, Job.attempts, Job.progress)
                             .where(Job.id.in_(job_ids)))
            return {r.id: (r.status, r.attempts, r.progress) for r in rows}

    def list(self, tenant_id: str, *, after: str | None = None, limit: int = 20,
             order: str = "desc", status: JobStatus | None = None,
             kind: JobKind | None = None) -> tuple[list[JobRecord], bool]:
        """Cursor pagination on (created_at, id); returns (page, has_more)."""
        return self.find(JobFilter(tenant_id, status=status, kind=kind), after=after,
                         limit=limit, order=order)

    def find(self, f: JobFilter, *, after: str | None = None, limit: int = 20,
             order: str = "desc") -> tuple[list[JobRecord], bool]:
        """``list`` with every filter (``f.tenant_id`` None: every tenant's jobs)."""
        with self._sessions() as s:
            q = _filtered(select(Job), f)
            if after is not None:
                q = q.where(_after(s, f.tenant_id, after, order))
            if order == "desc":
                q = q.order_by(Job.created_at.desc(), Job.id.desc())
            else:
                q = q.order_by(Job.created_at.asc(), Job.id.asc())
            rows = s.scalars(q.limit(limit + 1)).all()
            return [_record(j) for j in rows[:limit]], len(rows) > limit

    # ---- worker transitions ----------------------------------------------------------

    def claim(self, job_id: str, worker_id: str, lease_s: float,
              token: str | None = None) -> JobRecord | None:
        """queued -> running, attempts + 1, with a lease. None if someone else won, or if
        ``token`` is not the job's current dispatch token (a superseded message)."""
        now = _now()
        params = {"job_id": job_id, "worker_id": worker_id, "now": now,
                  "lease": now + timedelta(seconds=lease_s)}
        if token is not None:
            params["token"] = token
        with self._sessions.begin() as s:
            # One round trip: the compare-and-set hands back the row it wrote.
            job = s.connection().execute(_CLAIM[token is not None], params).one_or_none()
            if job is None:
                return None
            stage_job_event(s, job_id, "started", job)
            history.open_attempt(s, job_id, job.attempts, worker_id, now)
            # Outputs are written only with ``completed``: a job leaving ``queued`` has none.
            return _record(job, outputs=())

    def claim_next(self, token: str, worker_id: str, lease_s: float) -> JobRecord | None:
        """A render message carrying ``token`` arrived: claim the fairest ready job of
        its pipeline's lane (``fair``), queued -> running with a lease, attempts + 1.
        None if no queued job holds the token (a superseded or used-up message) or
        nothing in the lane is ready."""
        now = _now()
        params = {"token": token, "p_worker": worker_id, "now": now,
                  "lease": now + timedelta(seconds=lease_s)}
        if self._dialect == "postgresql":
            return self._claim_in_one(params)
        with self._sessions() as s:
            holder = s.execute(fair.HOLDER, {"token": token}).first()
        if holder is None:
            return None
        pipeline, lane = holder.pipeline, fair.lane_of(holder.batch_id)
        params["p_pipeline"] = pipeline
        with self._sessions.begin() as s:
            params["p_vtime"] = vtime = fair.lock_lane(s, pipeline, lane)
            job = s.connection().execute(_FAIR_CLAIM[lane], params).one_or_none()
            if job is None:
                return None
            if job.dispatch_token != token:  # its message now wakes the lane for the holder
                s.connection().execute(fair.HAND_OVER, {"token": token,
                                                        "claimed_token": job.dispatch_token})
            fair.charge(s, pipeline, lane, job.tenant_id, vtime)
            stage_job_event(s, job.id, "started", job)
            history.open_attempt(s, job.id, job.attempts, worker_id, now)
            return _record(job, outputs=())

    def _claim_in_one(self, params: dict[str, Any]) -> JobRecord | None:
        """``claim_next`` on PostgreSQL: the lane's lock, then one statement
        (``hotpath.CLAIM``) that claims and writes what a claim writes."""
        with self._engine.begin() as conn:
            lane = conn.execute(hotpath.LOCK_LANE, params).first()
            if lane is None:
                return None
            params.update(p_pipeline=lane.pipeline, p_vtime=lane.vtime,
                          p_event=new_event_id())
            job = conn.execute(hotpath.CLAIM[lane.lane], params).one_or_none()
            return None if job is None else _record(job, outputs=())

    def _running(self, job_id: str, attempt: int):
        return update(Job).where(Job.id == job_id, Job.status == JobStatus.RUNNING.value,
                                 Job.attempts == attempt)

    def heartbeat(self, job_id: str, attempt: int, lease_s: float,
                  progress: int | None = None) -> bool:
        """Extend the lease; False means the job is no longer ours (cancelled, reaped)."""
        now = _now()
        params: dict[str, Any] = {"job_id": job_id, "attempt": attempt, "now": now,
                                  "lease": now + timedelta(seconds=lease_s)}
        if progress is not None:
            params["new_progress"] = max(0, min(99, progress))
        # One statement on its own (autocommit): one round trip, no BEGIN and COMMIT.
        with self._engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            return conn.execute(_HEARTBEAT[progress is not None], params).rowcount == 1

    def complete(self, job_id: str, attempt: int, outputs: list[OutputRecord],
                 output_ttl_s: float, render: tuple[float, str | None] | None = None) -> bool:
        """Outputs + running -> completed + the usage record in one transaction (one
        statement on PostgreSQL, ``hotpath.COMPLETE``); nothing written if we lost. A
        running job has no outputs (they are written only here, and completed is final).
        The outputs expire ``output_ttl_s`` after completion; ``render``: the worker's
        (seconds in the pipeline, device) for this attempt.

        A dropped connection is ServiceUnavailable (retryable): the caller may try again.
        """
        now = _now()
        if self._dialect == "postgresql":
            with self._engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
                return c.execute(hotpath.COMPLETE, {
                    "p_job": job_id, "p_attempt": attempt, "now": now,
                    "p_expires": now + timedelta(seconds=output_ttl_s),
                    "p_outputs": [asdict(o) for o in outputs], "p_event": new_event_id(),
                    "timed": render is not None, "p_render": render and render[0],
                    "p_device": render and render[1], **hotpath.media(outputs)}
                ).first() is not None
        with self._sessions.begin() as s:
            res = s.execute(self._running(job_id, attempt).values(
                status=JobStatus.COMPLETED.value, progress=100, completed_at=now,
                updated_at=now, lease_expires_at=None,
                expires_at=now + timedelta(seconds=output_ttl_s)))
            if res.rowcount != 1:
                return False
            s.add_all(Output(job_id=job_id, created_at=now, **asdict(o)) for o in outputs)
            stage_job_event(s, job_id, "completed")
            history.close_attempt(s, job_id, now, history.COMPLETED, render=render)
            metering.settle(s, job_id, now)
            return True

    def fail(self, job_id: str, code: str, message: str, *, attempt: int | None = None,
             from_status: JobStatus = JobStatus.RUNNING, only_if_expired: bool = False,
             render: tuple[float, str | None] | None = None) -> bool:
        now = _now()
        q = update(Job).where(Job.id == job_id, Job.status == from_status.value)
        if attempt is not None:
            q = q.where(Job.attempts == attempt)
        if only_if_expired:
            q = q.where(Job.lease_expires_at < now)
        with self._sessions.begin() as s:
            failed = s.execute(q.values(
                status=JobStatus.FAILED.value, error_code=code[:64],
                error_message=message[:MESSAGE_LIMIT], completed_at=now, updated_at=now,
                lease_expires_at=None)).rowcount == 1
            if failed:
                stage_job_event(s, job_id, "failed")
                history.close_attempt(s, job_id, now, history.FAILED, code, message, render)
                metering.settle(s, job_id, now)
            return failed

    def cancel_overdue(self, job_id: str, attempt: int, message: str,
                       render: tuple[float, str | None] | None = None) -> bool:
        """running -> cancelled with ``deadline_exceeded``: the attempt ran past the
        caller's ``max_run_s``. Never retried."""
        return self._end(self._running(job_id, attempt), job_id, JobStatus.CANCELLED,
                         "deadline_exceeded", message, history.CANCELLED, render)

    def expire_claimed(self, job_id: str, attempt: int, message: str) -> bool:
        """running -> expired for an attempt claimed after the job's start deadline: it
        never runs. The claim's ``started`` event, not yet sent, is withdrawn."""
        return self._end(self._running(job_id, attempt), job_id, JobStatus.EXPIRED,
                         "start_deadline_exceeded", message, history.EXPIRED, (0.0, None),
                         withdraw_started=True)

    def expire_queued(self, limit: int = 100) -> list[str]:
        """queued -> expired for jobs whose start deadline has passed (the maintenance
        sweep), one compare-and-set each; the ids it expired."""
        now = _now()
        with self._sessions() as s:
            due = s.scalars(select(Job.id).where(
                Job.status == JobStatus.QUEUED.value, Job.start_by.is_not(None),
                Job.start_by < now, Job.started_at.is_(None))  # a retry has started
                .order_by(Job.start_by).limit(limit)).all()
        return [job_id for job_id in due if self._end(
            update(Job).where(Job.id == job_id, Job.status == JobStatus.QUEUED.value,
                              Job.started_at.is_(None)),
            job_id, JobStatus.EXPIRED, "start_deadline_exceeded",
            "the job did not start before its start deadline", history.EXPIRED, None)]

    def _end(self, q, job_id: str, status: JobStatus, code: str, message: str,
             outcome: str, render: tuple[float, str | None] | None,
             withdraw_started: bool = False) -> bool:
        """A deadline's end of the job (``q`` says which row), its event, its attempt's
        end and its usage record, in one transaction."""
        now = _now()
        with self._sessions.begin() as s:
            kind = s.scalar(q.values(
                status=status.value, error_code=code, error_message=message[:MESSAGE_LIMIT],
                completed_at=now, updated_at=now, lease_expires_at=None).returning(Job.kind))
            if kind is None:
                return False
            if withdraw_started:
                withdraw_event(s, job_id, f"{kind}.started")
            stage_job_event(s, job_id, _ended_event(kind, status))
            history.close_attempt(s, job_id, now, outcome, code, message, render)
            metering.settle(s, job_id, now)
            return True

    def record_render(self, job_id: str, attempt: int, render_s: float,
                      device: str | None) -> bool:
        """A worker's time for an attempt that ended without it (cancelled): recorded on
        the attempt, and the job's usage record rewritten if the job has ended."""
        now = _now()
        with self._sessions.begin() as s:
            if not history.record_render(s, job_id, attempt, render_s, device):
                return False
            status = s.scalar(select(Job.status).where(Job.id == job_id))
            if status is not None and JobStatus(status).terminal:
                metering.settle(s, job_id, now)
            return True

    def requeue(self, job_id: str, attempt: int, *, queue: str, delay_s: float,
                code: str, message: str, only_if_expired: bool = False,
                render: tuple[float, str | None] | None = None) -> OutboxRecord | None:
        """running -> queued for a retry, with its render message, in one transaction.

        ``only_if_expired`` (the reaper) also requires the lease to have run out, so a
        heartbeat that lands between the reaper's read and this write keeps the job.
        """
        q = self._running(job_id, attempt)
        if only_if_expired:
            q = q.where(Job.lease_expires_at < _now())
        return self._to_queue(q, job_id, queue, delay_s, code=code, message=message,
                              render=render)

    def hand_back(self, job_id: str, attempt: int, *, queue: str) -> OutboxRecord | None:
        """running -> queued at once, from a worker that stops (drain) before the job is
        done: the lease released, a fresh dispatch token and render message, and one more
        attempt allowed, since this one did not fail. The attempt number still grows at
        the next claim, so the stopping worker's late writes (fenced by it) change
        nothing."""
        return self._to_queue(self._running(job_id, attempt), job_id, queue, 0.0,
                              code="handed_back", message="the worker stopped before the "
                              "job was done and handed it back", max_attempts=Job.max_attempts + 1)

    def _to_queue(self, q, job_id: str, queue: str, delay_s: float, *, code: str,
                  message: str, render: tuple[float, str | None] | None = None,
                  **values: Any) -> OutboxRecord | None:
        """running -> queued (``q`` says which row) with a new token, and its render
        message in the same transaction."""
        now, token = _now(), new_token()
        ready_at = now + timedelta(seconds=delay_s) if delay_s > 0 else None
        with self._sessions.begin() as s:
            res = s.execute(q.values(
                status=JobStatus.QUEUED.value, worker_id=None, lease_expires_at=None,
                progress=0, updated_at=now, ready_at=ready_at, error_code=code[:64],
                error_message=message[:MESSAGE_LIMIT], dispatch_token=token, **values))
            if res.rowcount != 1:
                return None
            history.close_attempt(s, job_id, now, history.RETRIED, code, message, render)
            return outbox_record(add_render(s, job_id, queue, token, delay_s))

    def cancel(self, job_id: str, tenant_id: str) -> JobRecord | None:
        """queued|running -> cancelled. Returns the job as it stands afterwards."""
        now = _now()
        with self._sessions.begin() as s:
            if s.execute(update(Job).where(
                    Job.id == job_id, Job.tenant_id == tenant_id,
                    Job.status.in_([JobStatus.QUEUED.value, JobStatus.RUNNING.value])).values(
                    status=JobStatus.CANCELLED.value, completed_at=now, updated_at=now,
                    lease_expires_at=None)).rowcount == 1:
                stage_job_event(s, job_id, "cancelled")
                history.close_attempt(s, job_id, now, history.CANCELLED)
                metering.settle(s, job_id, now)
        return self.get(job_id, tenant_id)

    def attempts(self, job_id: str) -> list[JobAttemptRecord]:
        """The job's attempts, oldest first (its timeline)."""
        with self._sessions() as s:
            return history.attempts_of(s, job_id)

    def expired_leases(self, limit: int = 100) -> list[JobRecord]:
        with self._sessions() as s:
            rows = s.scalars(select(Job).where(
                Job.status == JobStatus.RUNNING.value,
                Job.lease_expires_at < _now()).order_by(Job.lease_expires_at)
                .limit(limit)).all()
            return [_record(j) for j in rows]

    def stale_queued(self, older_than_s: float, limit: int = 100) -> list[JobRecord]:
        """Queued jobs whose render message went out (and became due) more than
        ``older_than_s`` ago: candidates for a lost message. A job whose message is still
        in the outbox belongs to the relay, not here."""
        cutoff = _now() - timedelta(seconds=older_than_s)
        pending = select(OutboxMessage.id).where(
            OutboxMessage.job_id == Job.id,
            or_(OutboxMessage.published_at.is_(None), OutboxMessage.available_at > cutoff))
        with self._sessions() as s:
            # the status as the partial index's own predicate (ix_jobs_queued_updated)
            rows = s.scalars(select(Job).where(
                QUEUED, Job.updated_at < cutoff,
                ~pending.exists()).order_by(Job.updated_at).limit(limit)).all()
            return [_record(j) for j in rows]

    def republish(self, job: JobRecord, queue: str) -> OutboxRecord | None:
        """A fresh render message (and token) for a job whose message was lost. A CAS on the
        token the sweeper saw, so two sweepers don't both re-send it, and the lost message,
        should it turn up after all, can no longer claim the job."""
        now, token = _now(), new_token()
        seen = (Job.dispatch_token.is_(None) if job.dispatch_token is None
                else Job.dispatch_token == job.dispatch_token)
        with self._sessions.begin() as s:
            res = s.execute(update(Job).where(
                Job.id == job.id, Job.status == JobStatus.QUEUED.value, seen).values(
                updated_at=now, dispatch_token=token))
            if res.rowcount != 1:
                return None
            return outbox_record(add_render(s, job.id, queue, token))

    def delete(self, job_id: str, tenant_id: str) -> bool:
        with self._sessions.begin() as s:
            return s.execute(delete(Job).where(
                Job.id == job_id, Job.tenant_id == tenant_id)).rowcount == 1

    # ---- retention -------------------------------------------------------------------

    def outputs_to_expire(self, limit: int = 100) -> list[JobRecord]:
        """Completed jobs past ``expires_at`` whose objects are not deleted yet: a range of
        ``ix_jobs_outputs_due``, which holds only those not deleted yet."""
        with self._sessions() as s:
            rows = s.scalars(select(Job).where(
                OUTPUTS_KEPT, Job.expires_at <= _now())
                .order_by(Job.expires_at).limit(limit)).all()
            return [_record(j) for j in rows]

    def mark_outputs_deleted(self, job_id: str) -> bool:
        now = _now()
        with self._sessions.begin() as s:
            return s.execute(update(Job).where(Job.id == job_id).values(
                outputs_deleted_at=now, updated_at=now)).rowcount == 1

    def finished_before(self, older_than_s: float, limit: int = 100) -> list[JobRecord]:
        """Jobs that ended more than ``older_than_s`` ago: their records may go."""
        cutoff = _now() - timedelta(seconds=older_than_s)
        with self._sessions() as s:
            rows = s.scalars(select(Job).where(
                Job.completed_at < cutoff, Job.status.in_([t.value for t in TERMINAL]))
                .order_by(Job.completed_at).limit(limit)).all()
            return [_record(j) for j in rows]

    def delete_finished(self, job_id: str) -> bool:
        with self._sessions.begin() as s:
            return s.execute(delete(Job).where(
                Job.id == job_id, Job.status.in_([t.value for t in TERMINAL]))).rowcount == 1

    def live_keys(self, job_ids: list[str]) -> dict[str, JobObjects]:
        """For the orphan sweep: per existing job, the object keys it still owns, or (while
        it is queued or running, and anything under its prefix may be in flight) the first
        attempt that may still write. A job missing from the answer no longer exists:
        everything under its prefix is orphaned."""
        if not job_ids:
            return {}
        with self._sessions() as s:
            rows = s.scalars(select(Job).where(Job.id.in_(job_ids))).all()
            return {j.id: _owned_keys(j) for j in rows}


def _owned_keys(j: Job) -> JobObjects:
    status = JobStatus(j.status)
    if status is JobStatus.RUNNING:  # the current attempt writes; earlier ones are over
        return JobObjects(None, j.attempts)
    if status is JobStatus.QUEUED:  # the next claim is attempt + 1
        return JobObjects(None, j.attempts + 1)
    if status is JobStatus.COMPLETED and j.outputs_deleted_at is None:
        return JobObjects(frozenset(o.key for o in j.outputs))
    return JobObjects(frozenset())
