"""Queue signals from the source of truth: what waits, what runs, what got done.

The gauges autoscalers and dashboards read (``omnijobs_queue_depth`` and the rest) are
computed here from the jobs table, not from any one process's memory, so every reader
sees the same numbers whichever process serves them. A read is four statements,
each on an index: the queued jobs' two partial indexes (one per lane, holding queued
jobs only, so an index-only scan whose cost follows the queue, never the table's
history), running jobs by status, completions by ``completed_at``.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from sqlalchemy import case, func, select, text
from sqlalchemy.orm import Session, sessionmaker

from core.batches import BULK_LANE

from ..models import QUEUED_BULK, QUEUED_INTERACTIVE, Job
from ..records import LaneSignals, QueueSignals
from .quotas import INTERACTIVE

LANES = (INTERACTIVE, BULK_LANE)
# Written as the indexes' own predicates (literals, not parameters), so the planner can
# prove that a partial index applies whatever plan it caches.
_QUEUED = {INTERACTIVE: QUEUED_INTERACTIVE, BULK_LANE: QUEUED_BULK}
_RUNNING = text("status = 'running'")
_COMPLETED = text("status = 'completed'")


class QueueRepository:
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    def signals(self, pipelines: Iterable[str], window_s: float) -> QueueSignals:
        """Every lane of every pipeline named (zeros where nothing waits, so a gauge
        reads 0 rather than going missing) and of any other pipeline that has jobs."""
        now = datetime.now(UTC)
        with self._sessions() as s:
            queued = {(lane, p): (n, oldest) for lane in LANES
                      for p, n, oldest in s.execute(_queued(lane))}
            running = {p: n for p, n in s.execute(
                select(Job.pipeline, func.count()).where(_RUNNING).group_by(Job.pipeline))}
            completed = {(lane, p): n for p, lane, n in s.execute(
                _completed(now - timedelta(seconds=window_s)))}
        names = sorted({*pipelines, *running, *(p for _, p in (*queued, *completed))})
        lanes = tuple(
            LaneSignals(pipeline=p, lane=lane, queued=queued.get((lane, p), (0, None))[0],
                        oldest_queued_at=queued.get((lane, p), (0, None))[1],
                        completed=completed.get((lane, p), 0))
            for p in names for lane in LANES)
        return QueueSignals(at=now, window_s=window_s, lanes=lanes,
                            running={p: running.get(p, 0) for p in names})


def _queued(lane: str):
    return (select(Job.pipeline, func.count(), func.min(Job.created_at))
            .where(_QUEUED[lane]).group_by(Job.pipeline))


def _completed(since: datetime):
    lane = case((Job.batch_id.is_(None), INTERACTIVE), else_=BULK_LANE)
    return (select(Job.pipeline, lane, func.count())
            .where(Job.completed_at >= since, _COMPLETED)
            .group_by(Job.pipeline, lane))
