"""What the console's Overview and Usage pages show, counted from the jobs table: per
pipeline and lane the queue (queued, running, the oldest queued job), the outcomes of
the last hour (completions, failures by reason, in buckets for a small chart), and per
tenant the jobs finished and the media they produced, by day.

Everything is scoped like every other read (``tenant_id`` None: every tenant). These are
aggregates over indexed columns (status, completed_at), a handful of grouped queries
per page view, never a row per job.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import Integer, case, cast, extract, func, select
from sqlalchemy.orm import Session, sessionmaker

from core.batches import BULK_LANE
from core.jobs import JobKind, JobStatus

from ..models import Job, Output, Tenant
from ..records import MAIN
from .quotas import INTERACTIVE
from .scope import tenant_is


@dataclass(frozen=True)
class QueueRow:
    pipeline: str
    lane: str
    queued: int
    running: int
    oldest_queued_at: datetime | None


@dataclass(frozen=True)
class OutcomeRow:
    pipeline: str
    status: str  # completed or failed
    reason: str | None  # the failure's code
    count: int
    buckets: tuple[int, ...]  # oldest first, ``bucket_s`` each, over the window


@dataclass(frozen=True)
class UsageRow:
    tenant: str
    day: str  # YYYY-MM-DD, UTC
    completed: int
    failed: int
    audio_s: float
    video_s: float
    output_bytes: int


def _lane():
    return case((Job.batch_id.is_(None), INTERACTIVE), else_=BULK_LANE)


def _epoch(column, dialect: str):
    """Seconds since 1970 of a timestamp column, on either backend."""
    if dialect == "sqlite":
        return cast(func.strftime("%s", column), Integer)
    return extract("epoch", column)


def _seconds(media, kind: JobKind):
    return func.coalesce(func.sum(media.c.seconds).filter(Job.kind == kind.value), 0)


def _day(column, dialect: str):
    if dialect == "sqlite":
        return func.date(column)
    return func.to_char(func.timezone("UTC", column), "YYYY-MM-DD")


class ActivityRepository:
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    def _dialect(self, s: Session) -> str:
        return s.get_bind().dialect.name

    def queues(self, tenant_id: str | None) -> list[QueueRow]:
        active = (JobStatus.QUEUED.value, JobStatus.RUNNING.value)
        queued = Job.status == JobStatus.QUEUED.value
        with self._sessions() as s:
            rows = s.execute(select(
                Job.pipeline, _lane().label("lane"), func.count().filter(queued),
                func.count().filter(Job.status == JobStatus.RUNNING.value),
                func.min(case((queued, Job.created_at)))).where(
                Job.status.in_(active), tenant_is(Job.tenant_id, tenant_id))
                .group_by(Job.pipeline, "lane").order_by(Job.pipeline, "lane")).all()
        return [QueueRow(p, lane, q, r, _utc(oldest)) for p, lane, q, r, oldest in rows]

    def outcomes(self, tenant_id: str | None, window_s: float, bucket_s: float
                 ) -> list[OutcomeRow]:
        """Completions and failures (by reason) that ended within the window."""
        since = datetime.now(UTC) - timedelta(seconds=window_s)
        n = max(1, int(window_s // bucket_s))
        with self._sessions() as s:
            bucket = func.floor((_epoch(Job.completed_at, self._dialect(s))
                                 - since.timestamp()) / bucket_s)
            rows = s.execute(select(Job.pipeline, Job.status, Job.error_code,
                                    bucket.label("bucket"), func.count()).where(
                Job.completed_at >= since, tenant_is(Job.tenant_id, tenant_id),
                Job.status.in_((JobStatus.COMPLETED.value, JobStatus.FAILED.value)))
                .group_by(Job.pipeline, Job.status, Job.error_code, "bucket")).all()
        grouped: dict[tuple, list[int]] = {}
        for pipeline, status, code, b, count in rows:
            key = (pipeline, status, code if status == JobStatus.FAILED.value else None)
            counts = grouped.setdefault(key, [0] * n)
            counts[min(n - 1, max(0, int(b)))] += count
        return [OutcomeRow(p, st, code, sum(c), tuple(c))
                for (p, st, code), c in sorted(grouped.items(), key=lambda kv: (
                    kv[0][0], kv[0][1], kv[0][2] or ""))]

    def usage(self, tenant_id: str | None, days: int) -> list[UsageRow]:
        """Per tenant and day (UTC): jobs finished and the media their outputs hold."""
        since = datetime.now(UTC) - timedelta(days=days)
        with self._sessions() as s:
            day = _day(Job.completed_at, self._dialect(s)).label("day")
            media = (select(Output.job_id, func.sum(Output.duration_s).label("seconds"),
                            func.sum(Output.bytes).label("bytes"))
                     .where(Output.variant == MAIN).group_by(Output.job_id).subquery())
            done = Job.status == JobStatus.COMPLETED.value
            rows = s.execute(select(
                Tenant.name, day, func.count().filter(done),
                func.count().filter(Job.status == JobStatus.FAILED.value),
                _seconds(media, JobKind.SPEECH), _seconds(media, JobKind.VIDEO),
                func.coalesce(func.sum(media.c.bytes), 0))
                .join(Tenant, Tenant.id == Job.tenant_id)
                .outerjoin(media, media.c.job_id == Job.id).where(
                Job.completed_at >= since, tenant_is(Job.tenant_id, tenant_id),
                Job.status.in_((JobStatus.COMPLETED.value, JobStatus.FAILED.value)))
                .group_by(Tenant.name, "day").order_by(day.desc(), Tenant.name)).all()
        return [UsageRow(t, str(d), c, f, float(a), float(v), int(b))
                for t, d, c, f, a, v, b in rows]


def _utc(value: datetime | None) -> datetime | None:
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)
