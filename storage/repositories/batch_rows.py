"""What the batch repository's two sides share: batch ids, the record with its live
counts, and the predicates of a batch's lease and of its unfinished jobs."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime

from sqlalchemy import exists, func, or_, select
from sqlalchemy.orm import Session

from core.batches import BatchStatus
from core.errors import InvalidRequest
from core.jobs import JobStatus

from ..models import Batch, Job
from ..records import BatchRecord, RequestCounts, UsageRecord
from .scope import tenant_is

ACTIVE = (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS, BatchStatus.FINALIZING,
          BatchStatus.CANCELLING)
UNFINISHED_JOB = (JobStatus.QUEUED.value, JobStatus.RUNNING.value)


def utcnow() -> datetime:
    return datetime.now(UTC)


# Batch ids are minted here; anything else names no batch (and never reaches the database).
BATCH_ID = re.compile(r"batch_[0-9a-f]{32}")


def new_batch_id() -> str:
    return "batch_" + uuid.uuid4().hex


def lease_free(now: datetime):
    return or_(Batch.lease_expires_at.is_(None), Batch.lease_expires_at < now)


def unfinished():
    return exists().where(Job.batch_id == Batch.id, Job.status.in_(UNFINISHED_JOB))


def batch_cursor(s: Session, tenant_id: str | None, after: str):
    """(created_at, id) of the tenant's batch ``after``; an unknown one is an error, never
    a restart at page one (a client paging through would loop)."""
    row = s.execute(select(Batch.created_at, Batch.id).where(
        Batch.id == after, tenant_is(Batch.tenant_id, tenant_id))).first() \
        if BATCH_ID.fullmatch(after) else None
    if row is None:
        raise InvalidRequest("'after' is not a batch of this list (unknown or deleted)",
                             param="after", code="invalid_cursor")
    return row


def batch_record(b: Batch, counts: RequestCounts | None = None,
            usage: UsageRecord | None = None) -> BatchRecord:
    return BatchRecord(
        id=b.id, tenant_id=b.tenant_id, endpoint=b.endpoint, input_file_id=b.input_file_id,
        completion_window=b.completion_window, status=BatchStatus(b.status),
        metadata=b.metadata_, errors=b.errors, output_file_id=b.output_file_id,
        error_file_id=b.error_file_id,
        counts=counts or RequestCounts(b.total, b.completed, b.failed),
        created_at=b.created_at, expires_at=b.expires_at, in_progress_at=b.in_progress_at,
        finalizing_at=b.finalizing_at, completed_at=b.completed_at, failed_at=b.failed_at,
        expired_at=b.expired_at, cancelling_at=b.cancelling_at, cancelled_at=b.cancelled_at,
        output_expires_after_s=b.output_expires_after_s, usage=usage)


def live_counts(s: Session, batches: list[Batch]) -> dict[str, RequestCounts]:
    """Live counts for unfinished batches (finished ones keep the counts they ended
    with): a cancelled, expired or failed job counts as failed, as does a refused line."""
    live = [b for b in batches if BatchStatus(b.status) in ACTIVE]
    if not live:
        return {}
    by_status: dict[str, dict[str, int]] = {b.id: {} for b in live}
    for batch_id, status, n in s.execute(select(Job.batch_id, Job.status, func.count()).where(
            Job.batch_id.in_(list(by_status))).group_by(Job.batch_id, Job.status)):
        by_status[batch_id][status] = n
    return {b.id: RequestCounts(
        total=b.total, completed=by_status[b.id].get(JobStatus.COMPLETED.value, 0),
        failed=b.rejected + sum(by_status[b.id].get(st.value, 0)
                                for st in (JobStatus.FAILED, JobStatus.CANCELLED,
                                           JobStatus.EXPIRED)))
        for b in live}
