"""The worker registry on both backends: a beat writes (then renews) the process's row,
readers see only rows whose heartbeat has not expired, a draining worker serves nothing,
a clean exit removes the row, maintenance prunes the long dead."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import update

from storage.db import make_engine, make_sessionmaker
from storage.models import Worker
from storage.records import InFlightJob, SlotCount, WorkerBeat
from storage.repositories import WorkerRepository


@pytest.fixture
def registry(db_url):
    sessions = make_sessionmaker(make_engine(db_url))
    return WorkerRepository(sessions), sessions


def beat(pipelines: tuple[str, ...], role: str = "worker") -> WorkerBeat:
    return WorkerBeat(id=f"host:{uuid.uuid4().hex[:8]}", role=role, host="host", pid=4242,
                      pipelines=pipelines, device="gpu 0", version="0.1.0",
                      started_at=datetime.now(UTC))


def test_a_beat_writes_then_renews_the_row(registry):
    repo, _ = registry
    p = f"p-{uuid.uuid4().hex[:8]}"
    me = beat((p,))
    repo.beat(me, ttl_s=30)
    [row] = [w for w in repo.live() if w.id == me.id]
    assert (row.role, row.pipelines, row.device, row.job_id, row.draining_at) == (
        "worker", (p,), "gpu 0", None, None)
    repo.beat(replace(me, job_id="job_x"), ttl_s=30)
    [again] = [w for w in repo.live() if w.id == me.id]
    assert again.job_id == "job_x" and again.heartbeat_at >= row.heartbeat_at
    assert again.expires_at > again.heartbeat_at
    assert repo.serving([p])[p] == 1


def test_a_draining_worker_serves_nothing_and_keeps_its_first_drain_time(registry):
    repo, _ = registry
    p = f"p-{uuid.uuid4().hex[:8]}"
    me = beat((p,))
    repo.beat(replace(me, draining=True), ttl_s=30)
    [first] = [w for w in repo.live() if w.id == me.id]
    repo.beat(replace(me, draining=True), ttl_s=30)
    [second] = [w for w in repo.live() if w.id == me.id]
    assert first.draining_at is not None and second.draining_at == first.draining_at
    assert repo.serving([p])[p] == 0


def test_expired_rows_drop_out_and_are_pruned_later(registry):
    repo, sessions = registry
    p = f"p-{uuid.uuid4().hex[:8]}"
    dead, alive, maint = beat((p,)), beat((p,)), beat((), role="maintenance")
    for w in (dead, alive, maint):
        repo.beat(w, ttl_s=30)
    with sessions.begin() as s:  # its heartbeats stopped two hours ago
        s.execute(update(Worker).where(Worker.id == dead.id).values(
            expires_at=datetime.now(UTC) - timedelta(hours=2)))
    live = {w.id for w in repo.live()}
    assert alive.id in live and maint.id in live and dead.id not in live
    assert dead.id in {w.id for w in repo.listed()}
    assert repo.serving([p])[p] == 1  # the maintenance process serves no pipeline
    assert repo.prune(dead_for_s=3600) >= 1
    assert dead.id not in {w.id for w in repo.listed()}
    assert repo.remove(alive.id) and not repo.remove(alive.id)
    assert repo.serving([p])[p] == 0


def test_a_beat_records_the_slots_and_every_job_in_flight(registry):
    """An engine with 8 slots, 3 held (a guided job holds two), and a third job that only
    waits for its upload: the row says so, and the fleet's slot counts sum the workers
    that take the pipeline (a draining one takes nothing: its slots are not capacity,
    but a job it finalizes still counts as finalizing)."""
    repo, _ = registry
    p = f"p-{uuid.uuid4().hex[:8]}"
    jobs = (InFlightJob("job_a", p), InFlightJob("job_b", p),
            InFlightJob("job_c", p, finalizing=True))
    me = replace(beat((p,)), slots=8, slots_busy=3, in_flight=jobs)
    repo.beat(me, ttl_s=30)
    [row] = [w for w in repo.live() if w.id == me.id]
    assert (row.slots, row.slots_busy, row.in_flight) == (8, 3, jobs)
    counts = repo.slots([p, "other"])  # "other": named, served by none
    assert (counts[p], counts["other"]) == (SlotCount(1, slots=8, busy=3, finalizing=1),
                                            SlotCount())
    repo.beat(replace(beat((p,)), slots=8, slots_busy=8), ttl_s=30)
    repo.beat(replace(beat((p,)), slots=8, slots_busy=1, draining=True,
                      in_flight=(InFlightJob("job_d", p, finalizing=True),)), ttl_s=30)
    assert repo.slots([p])[p] == SlotCount(2, slots=16, busy=11, finalizing=2)
    repo.beat(replace(me, slots_busy=0, in_flight=()), ttl_s=30)  # all three done
    [row] = [w for w in repo.live() if w.id == me.id]
    assert (row.slots_busy, row.in_flight) == (0, ())
