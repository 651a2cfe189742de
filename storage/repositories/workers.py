"""The worker registry: each process of the fleet writes its own row by heartbeat.

A row says who the process is (host, pid, pipelines, device, version, start time), what
it is doing (the job it generates, whether it drains) and until when it counts as alive
(``expires_at``, a few heartbeat periods ahead). Readers take only rows that have not
expired, so a process that died without a word drops out once its heartbeats stop; a
process that stops cleanly deletes its row. The table holds one row per process, so
every read here is a scan of a few rows.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session, sessionmaker

from ..models import Worker
from ..records import InFlightJob, SlotCount, WorkerBeat, WorkerRecord


def _now() -> datetime:
    return datetime.now(UTC)


def _record(w: Worker) -> WorkerRecord:
    return WorkerRecord(id=w.id, role=w.role, host=w.host, pid=w.pid,
                        pipelines=tuple(w.pipelines), device=w.device, version=w.version,
                        started_at=w.started_at, heartbeat_at=w.heartbeat_at,
                        expires_at=w.expires_at, job_id=w.job_id, draining_at=w.draining_at,
                        slots=w.slots, slots_busy=w.slots_busy,
                        in_flight=tuple(InFlightJob(*job) for job in w.in_flight or ()))


class WorkerRepository:
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    def beat(self, beat: WorkerBeat, ttl_s: float) -> None:
        """Write the process's row: alive for ``ttl_s`` more seconds. One UPDATE on its
        own (a worker beats at every claim and completion, beside the job's own
        statements), or an insert the first time (only the process itself writes its
        row, so they never race)."""
        now = _now()
        values = {"role": beat.role, "host": beat.host, "pid": beat.pid,
                  "pipelines": list(beat.pipelines), "device": beat.device,
                  "version": beat.version, "started_at": beat.started_at,
                  "heartbeat_at": now, "expires_at": now + timedelta(seconds=ttl_s),
                  "job_id": beat.job_id, "slots": beat.slots, "slots_busy": beat.slots_busy,
                  "in_flight": [[j.id, j.pipeline, j.finalizing] for j in beat.in_flight]}
        draining = {"draining_at": func.coalesce(Worker.draining_at, now)} if beat.draining \
            else {}
        engine = self._sessions.kw["bind"]
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            done = conn.execute(update(Worker).where(Worker.id == beat.id).values(
                **values, **draining)).rowcount
        if not done:
            with self._sessions.begin() as s:
                s.add(Worker(id=beat.id, draining_at=now if beat.draining else None,
                             **values))

    def remove(self, worker_id: str) -> bool:
        """A process that stops cleanly takes its row with it."""
        with self._sessions.begin() as s:
            return s.execute(delete(Worker).where(Worker.id == worker_id)).rowcount == 1

    def live(self) -> list[WorkerRecord]:
        """Every process whose heartbeat has not expired, by role, host and pid."""
        with self._sessions() as s:
            rows = s.scalars(select(Worker).where(Worker.expires_at > _now())
                             .order_by(Worker.role, Worker.host, Worker.pid)).all()
            return [_record(w) for w in rows]

    def listed(self) -> list[WorkerRecord]:
        """Every row, the expired ones (dead processes not yet pruned) included."""
        with self._sessions() as s:
            rows = s.scalars(select(Worker).order_by(Worker.role, Worker.host,
                                                     Worker.pid)).all()
            return [_record(w) for w in rows]

    def serving(self, pipelines: list[str] | tuple[str, ...]) -> dict[str, int]:
        """Live render workers taking each pipeline's jobs (draining ones do not), for
        every pipeline named (0 where none) and any other a live worker serves."""
        return {name: count.workers for name, count in self.slots(pipelines).items()}

    def slots(self, pipelines: list[str] | tuple[str, ...]) -> dict[str, SlotCount]:
        """Per pipeline, what ``serving`` counts and those workers' engine slots, in all
        and held (a worker that serves several pipelines counts under each), and its
        jobs only finalizing on any live worker: for every pipeline named and any other
        a live worker serves. One read of the registry."""
        counts = {name: SlotCount() for name in pipelines}
        for worker in self.live():
            for name in worker.pipelines:
                if worker.serves(name):
                    c = counts.get(name, SlotCount())
                    counts[name] = replace(c, workers=c.workers + 1, slots=c.slots + worker.slots,
                                           busy=c.busy + worker.slots_busy)
            for job in worker.in_flight:
                if job.finalizing and worker.role == "worker":
                    c = counts.get(job.pipeline, SlotCount())
                    counts[job.pipeline] = replace(c, finalizing=c.finalizing + 1)
        return counts

    def prune(self, dead_for_s: float) -> int:
        """Delete the rows of processes whose heartbeat expired ``dead_for_s`` ago."""
        cutoff = _now() - timedelta(seconds=dead_for_s)
        with self._sessions.begin() as s:
            return s.execute(delete(Worker).where(Worker.expires_at < cutoff)).rowcount
