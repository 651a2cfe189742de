"""Admission: may one more job enter? Counted before the submit's insert.

Each count is an index range scan that stops at its limit, so the check costs at most
that many index entries whatever the table's size. Two submits racing at the limit may
both pass (the count is not serialised with the insert): a cap can be overshot by the
submits in flight at that moment, never by more.

A count far from its cap decides nothing, so it is not read on every group: while a
process last read a tenant's active jobs or a pipeline's queue below half the cap, it
counts again at most every ``FRESH_S`` and adds its own admissions in between; from half
the cap on, every group counts. Only a fleet admitting more than half a cap within
``FRESH_S`` (for a tenant: far beyond its submit rate limit) could overshoot by more
than the submits in flight. A group far from every cap reads nothing before its insert.

A pipeline's queue found full is remembered as full for ``FRESH_S`` too: a flood of
submits against a full queue (the overload the cap exists for) is refused without
counting up to the cap's index entries per group; room made meanwhile is seen at the
next count, within ``FRESH_S`` (the refusal's ``Retry-After`` asks for longer). A
tenant's own cap is not remembered so: a tenant that cancels a job may submit again at
once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from sqlalchemy import bindparam, func, literal, select
from sqlalchemy.orm import Session

from core.errors import TooManyRequests
from core.jobs import JobStatus

from ..models import Job
from ..records import NewJob

INTERACTIVE = "interactive"
ACTIVE = (JobStatus.QUEUED.value, JobStatus.RUNNING.value)
ACTIVE_RETRY_AFTER_S = 5
QUEUE_RETRY_AFTER_S = 10
FRESH_S = 1.0


@dataclass(frozen=True)
class Quota:
    """The limits of one lane of work."""

    max_active_per_tenant: int
    max_queued_per_pipeline: int


class Quotas:
    """Quotas by lane (interactive submits today; bulk work brings its own lane)."""

    def __init__(self, by_lane: Mapping[str, Quota], clock=time.monotonic) -> None:
        self._by_lane = dict(by_lane)
        self._clock = clock
        # (kind, name, cap) -> (when counted, the count then plus this process's admissions)
        self._seen: dict[tuple[str, str, int], tuple[float, int]] = {}

    def admit(self, s: Session, *, tenant_id: str, lane: str, pipeline: str) -> None:
        """Raise TooManyRequests if the tenant or the pipeline's queue is full. Only
        interactive jobs count: a batch's jobs (the bulk lane) have the batch quota."""
        quota = self._by_lane[lane]
        cap = quota.max_active_per_tenant
        if _count(s, cap, Job.tenant_id == tenant_id, Job.status.in_(ACTIVE)) >= cap:
            raise _too_many_active(cap)
        cap = quota.max_queued_per_pipeline
        if _count(s, cap, Job.pipeline == pipeline,
                  Job.status == JobStatus.QUEUED.value) >= cap:
            raise _queue_full(pipeline)

    def admit_many(self, read: Callable[[Any, dict], Sequence[int]], news: Sequence[NewJob]
                   ) -> list[TooManyRequests | None]:
        """``admit`` for a group of submits, with the counts it needs in one statement
        (``read(statement, params)`` runs it; none when every count is known): per job,
        None if admitted, else its refusal (the group's earlier admissions count against
        the caps, as committed jobs would)."""
        now = self._clock()
        wanted: dict[tuple, None] = {}
        known: dict[tuple, int] = {}  # counted recently, far from their caps
        for new in news:
            quota = self._by_lane[new.lane]
            for key in (("tenant", new.tenant_id, quota.max_active_per_tenant),
                        ("pipeline", new.pipeline, quota.max_queued_per_pipeline)):
                seen = self._seen.get(key)
                if seen is not None and now - seen[0] < FRESH_S and _settled(key, seen[1]):
                    known[key] = seen[1]
                else:
                    wanted.setdefault(key)
        counts: dict[tuple, int] = {}
        if wanted:
            statement = _counts_statement(tuple((kind, cap) for kind, _, cap in wanted))
            row = read(statement, {f"n{i}": key[1] for i, key in enumerate(wanted)})
            counts = dict(zip(wanted, row, strict=True))
        read_at = dict.fromkeys(counts, now)
        counts.update(known)
        out: list[TooManyRequests | None] = []
        for new in news:
            quota = self._by_lane[new.lane]
            tenant = ("tenant", new.tenant_id, quota.max_active_per_tenant)
            pipeline = ("pipeline", new.pipeline, quota.max_queued_per_pipeline)
            if counts[tenant] >= tenant[2]:
                out.append(_too_many_active(tenant[2]))
            elif counts[pipeline] >= pipeline[2]:
                out.append(_queue_full(new.pipeline))
            else:
                counts[tenant] += 1
                counts[pipeline] += 1
                out.append(None)
        for key in counts:
            at = read_at.get(key, self._seen.get(key, (now,))[0])
            self._seen[key] = (at, counts[key])
        return out


def _settled(key: tuple[str, str, int], count: int) -> bool:
    """A count that decides nothing before it is read again: far below the cap, or a
    pipeline's queue at its cap (full until the next count)."""
    kind, _, cap = key
    return count < cap // 2 or (kind == "pipeline" and count >= cap)


def _too_many_active(cap: int) -> TooManyRequests:
    return TooManyRequests(
        f"at most {cap} jobs may be queued or running per tenant; wait for some "
        "to finish", code="too_many_active_jobs", retry_after_s=ACTIVE_RETRY_AFTER_S)


def _queue_full(pipeline: str) -> TooManyRequests:
    return TooManyRequests(f"the queue of '{pipeline}' is full; try again later",
                           code="queue_full", retry_after_s=QUEUE_RETRY_AFTER_S)


def _count(s: Session, cap: int, *where) -> int:
    """Rows matching ``where``, counted up to ``cap`` only."""
    return s.scalar(_capped(cap, *where))


@lru_cache(maxsize=64)
def _counts_statement(shape: tuple[tuple[str, int], ...]):
    """One statement per shape (which counts, with which caps), built once: the names
    are bound parameters, so a group pays no expression building, and the compiled
    form comes from SQLAlchemy's cache."""
    counts = []
    for i, (kind, cap) in enumerate(shape):
        name = bindparam(f"n{i}")
        where = ((Job.tenant_id == name, Job.status.in_(ACTIVE)) if kind == "tenant"
                 else (Job.pipeline == name, Job.status == JobStatus.QUEUED.value))
        counts.append(_capped(cap, *where).scalar_subquery())
    return select(*counts)


def _capped(cap: int, *where):
    capped = select(literal(1)).select_from(Job).where(*where, Job.batch_id.is_(None)).limit(
        cap).subquery()
    return select(func.count()).select_from(capped)
