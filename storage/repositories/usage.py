"""Usage: what each finished job cost, written by the transaction that ended it, and its
sums (per batch, per tenant in time buckets) for the API, the CLI and the console.

A job's record is rebuilt from its attempts (each carries the worker's own wall time in
the pipeline) and its outputs, so it never disagrees with them; writing it again (a
cancelled attempt's time reported after the cancel) replaces it. Sums are grouped
queries on ``(tenant_id, finished_at)``, never a row per job in Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Integer, cast, delete, func, insert, select
from sqlalchemy.orm import Session, sessionmaker

from ..models import Job, JobAttempt, JobUsage, Output, Tenant
from ..records import MAIN, UsageRecord
from .activity import _epoch
from .scope import tenant_is

GROUPS = ("model", "pipeline", "batch_id")
COMPLETED = "completed"  # the attempt outcome whose time bought the output


def settle(s: Session, job_id: str, now: datetime) -> None:
    """Write (or rewrite) the job's usage record in the caller's transaction. Usage
    counts the jobs that ran, however they ended: a job that ended without an attempt
    (cancelled or expired while queued) has none, and is in no sum."""
    job = s.execute(select(Job.tenant_id, Job.kind, Job.model, Job.pipeline, Job.batch_id,
                           Job.status, Job.attempts, Job.request, Job.completed_at)
                    .where(Job.id == job_id)).first()
    if job is None:
        return
    if not job.attempts:
        s.execute(delete(JobUsage).where(JobUsage.job_id == job_id))
        return
    render = failed = 0.0
    device = None
    for outcome, seconds, where in s.execute(select(
            JobAttempt.outcome, JobAttempt.render_s, JobAttempt.device).where(
            JobAttempt.job_id == job_id).order_by(JobAttempt.attempt)):
        render += seconds or 0.0
        failed += 0.0 if outcome == COMPLETED else seconds or 0.0
        device = where or device
    audio = video = 0.0
    frames = size = 0
    for duration, rate, n, nbytes in s.execute(select(
            Output.duration_s, Output.sample_rate, Output.frames, Output.bytes).where(
            Output.job_id == job_id, Output.variant == MAIN)):  # a video's previews: not media
        audio += (duration or 0.0) if rate else 0.0
        video += (duration or 0.0) if n else 0.0
        frames, size = frames + (n or 0), size + nbytes
    text = job.request.get("input") or job.request.get("prompt") or ""
    s.execute(delete(JobUsage).where(JobUsage.job_id == job_id))
    s.execute(insert(JobUsage).values(
        job_id=job_id, tenant_id=job.tenant_id, kind=job.kind, model=job.model,
        pipeline=job.pipeline, batch_id=job.batch_id, status=job.status,
        finished_at=job.completed_at or now, attempts=job.attempts, render_s=render,
        failed_render_s=failed, device=device, characters=len(text), audio_s=audio,
        video_s=video, frames=frames, bytes=size))


def record(u: JobUsage | None) -> UsageRecord | None:
    if u is None:
        return None
    return UsageRecord(render_s=u.render_s, failed_render_s=u.failed_render_s,
                       attempts=u.attempts, device=u.device, characters=u.characters,
                       audio_s=u.audio_s, video_s=u.video_s, frames=u.frames, bytes=u.bytes)


def _sums():
    return (func.count(), func.count().filter(JobUsage.status == COMPLETED),
            func.coalesce(func.sum(JobUsage.render_s), 0.0),
            func.coalesce(func.sum(JobUsage.failed_render_s), 0.0),
            func.coalesce(func.sum(JobUsage.attempts), 0),
            func.coalesce(func.sum(JobUsage.characters), 0),
            func.coalesce(func.sum(JobUsage.audio_s), 0.0),
            func.coalesce(func.sum(JobUsage.video_s), 0.0),
            func.coalesce(func.sum(JobUsage.frames), 0),
            func.coalesce(func.sum(JobUsage.bytes), 0))


def _summed(row) -> UsageRecord:
    jobs, completed, render, failed, attempts, chars, audio, video, frames, size = row
    return UsageRecord(render_s=float(render), failed_render_s=float(failed),
                       attempts=int(attempts), characters=int(chars), audio_s=float(audio),
                       video_s=float(video), frames=int(frames), bytes=int(size),
                       jobs=int(jobs), completed=int(completed))


@dataclass(frozen=True)
class UsageBucketRow:
    """One bucket's sums for one group (``group`` maps each grouped-by field to its
    value); ``start`` is the bucket's start, seconds since 1970."""

    start: int
    group: dict[str, str | None]
    usage: UsageRecord
    tenant: str | None = None  # the tenant's name, when summed per tenant


def batch_sums(s: Session, batch_ids: list[str]) -> dict[str, UsageRecord]:
    """The sum over each batch's finished jobs, for the batches that have any: one
    grouped query for a page of batches."""
    if not batch_ids:
        return {}
    return {r[0]: _summed(r[1:]) for r in s.execute(select(JobUsage.batch_id, *_sums()).where(
        JobUsage.batch_id.in_(batch_ids)).group_by(JobUsage.batch_id))}


class UsageRepository:
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    def buckets(self, tenant_id: str | None, start: int, end: int, width_s: int,
                group_by: tuple[str, ...] = (), per_tenant: bool = False
                ) -> list[UsageBucketRow]:
        """Sums of the jobs that finished in ``[start, end)`` (seconds since 1970), per
        bucket of ``width_s`` from ``start`` and per ``group_by`` value (and per tenant
        name with ``per_tenant``); only buckets and groups that have jobs."""
        unknown = set(group_by) - set(GROUPS)
        if unknown:
            raise ValueError(f"cannot group usage by {sorted(unknown)}")
        with self._sessions() as s:
            epoch = _epoch(JobUsage.finished_at, s.get_bind().dialect.name)
            bucket = cast(func.floor((epoch - start) / width_s), Integer) \
                if s.get_bind().dialect.name == "postgresql" \
                else cast((epoch - start) / width_s, Integer)
            keys = [getattr(JobUsage, g) for g in group_by]
            if per_tenant:
                keys.append(Tenant.name)
            q = select(bucket.label("bucket"), *keys, *_sums()).where(
                tenant_is(JobUsage.tenant_id, tenant_id),
                JobUsage.finished_at >= datetime.fromtimestamp(start, UTC),
                JobUsage.finished_at < datetime.fromtimestamp(end, UTC))
            if per_tenant:
                q = q.join(Tenant, Tenant.id == JobUsage.tenant_id)
            rows = s.execute(q.group_by("bucket", *keys).order_by("bucket", *keys)).all()
        n = len(keys)
        return [UsageBucketRow(
            start=start + int(r[0]) * width_s,
            group=dict(zip(group_by, r[1:1 + len(group_by)], strict=True)),
            tenant=r[n] if per_tenant else None, usage=_summed(r[1 + n:])) for r in rows]
