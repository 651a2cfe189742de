"""Admission: may one more job enter? Checked inside the submit transaction.

Each count is an index range scan that stops at its limit, so the check costs at most
that many index entries whatever the table's size. Two submits racing at the limit may
both pass (the count is not serialised with the insert): a cap can be overshot by the
submits in flight at that moment, never by more.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import func, literal, select
from sqlalchemy.orm import Session

from core.errors import TooManyRequests
from core.jobs import JobStatus

from ..models import Job

INTERACTIVE = "interactive"
ACTIVE = (JobStatus.QUEUED.value, JobStatus.RUNNING.value)
ACTIVE_RETRY_AFTER_S = 5
QUEUE_RETRY_AFTER_S = 10


@dataclass(frozen=True)
class Quota:
    """The limits of one lane of work."""

    max_active_per_tenant: int
    max_queued_per_pipeline: int


class Quotas:
    """Quotas by lane (interactive submits today; bulk work brings its own lane)."""

    def __init__(self, by_lane: Mapping[str, Quota]) -> None:
        self._by_lane = dict(by_lane)

    def admit(self, s: Session, *, tenant_id: str, lane: str, pipeline: str) -> None:
        """Raise TooManyRequests if the tenant or the pipeline's queue is full. Only
        interactive jobs count: a batch's jobs (the bulk lane) have the batch quota."""
        quota = self._by_lane[lane]
        cap = quota.max_active_per_tenant
        if _count(s, cap, Job.tenant_id == tenant_id, Job.status.in_(ACTIVE)) >= cap:
            raise TooManyRequests(
                f"at most {cap} jobs may be queued or running per tenant; wait for some "
                "to finish", code="too_many_active_jobs", retry_after_s=ACTIVE_RETRY_AFTER_S)
        cap = quota.max_queued_per_pipeline
        if _count(s, cap, Job.pipeline == pipeline,
                  Job.status == JobStatus.QUEUED.value) >= cap:
            raise TooManyRequests(f"the queue of '{pipeline}' is full; try again later",
                                  code="queue_full", retry_after_s=QUEUE_RETRY_AFTER_S)


def _count(s: Session, cap: int, *where) -> int:
    """Rows matching ``where``, counted up to ``cap`` only."""
    capped = select(literal(1)).select_from(Job).where(*where, Job.batch_id.is_(None)).limit(
        cap).subquery()
    return s.scalar(select(func.count()).select_from(capped))
