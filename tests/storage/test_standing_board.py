"""Queued jobs' places, on both backends: ``StandingRepository.ranks`` numbers many jobs
in one query exactly as ``rank`` counts each, and an API process's ``Standings`` asks it
once a lane per period for every job asked about lately, instead of a count per job
per look (what a thousand queued event streams used to cost)."""

from __future__ import annotations

import uuid
from dataclasses import replace

from sqlalchemy import event

from api import standing as module
from api.standing import Standings
from storage.repositories.standing import StandingRepository

from . import test_jobs_repository
from .test_jobs_repository import Repos

repos = test_jobs_repository.repos  # the same fixture (SQLite and PostgreSQL)


def queued(repos: Repos, pipeline: str, tenants: list[str], n: int) -> list:
    jobs = []
    for i in range(n):
        new = replace(repos.new_job(tenants[i % len(tenants)]), pipeline=pipeline)
        jobs.append(repos.jobs.create(new)[0])
    return jobs


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_ranks_number_the_jobs_as_rank_counts_them(repos: Repos):
    pipeline = "board-" + uuid.uuid4().hex[:8]
    jobs = queued(repos, pipeline, [repos.new_tenant(), repos.new_tenant()], 9)
    repo = StandingRepository(repos.sessions)
    # one of them waits out a retry's backoff: not ready, so not numbered
    late = jobs[4]
    claimed = repos.jobs.claim(late.id, "w", 60)
    repos.jobs.requeue(late.id, claimed.attempts, queue="q", delay_s=60, code="x",
                       message="y")
    ranks = repo.ranks(pipeline, "interactive", jobs)
    assert late.id not in ranks
    assert ranks == {j.id: repo.rank(j) for j in jobs if j.id != late.id}
    assert sorted(ranks.values()) == [0, 0, 1, 1, 2, 2, 3, 3]


def test_a_lane_s_places_are_read_once_a_period_for_every_job_asked(repos: Repos,
                                                                    monkeypatch):
    clock = Clock()
    monkeypatch.setattr(module.time, "monotonic", clock)
    pipeline = "board-" + uuid.uuid4().hex[:8]
    jobs = queued(repos, pipeline, [repos.new_tenant()], 30)
    standings = Standings(StandingRepository(repos.sessions), fleet=None, ttl_s=2.0)
    statements: list[str] = []
    engine = repos.sessions.kw["bind"]
    listener = lambda *a: statements.append(a[2])  # noqa: E731
    event.listen(engine, "before_cursor_execute", listener)
    try:
        first = [standings.of(j).position for j in jobs]  # new to the board: counted
        clock.now += 2.0
        statements.clear()
        second = [standings.of(j).position for j in jobs]
    finally:
        event.remove(engine, "before_cursor_execute", listener)
    assert first == second == list(range(30))
    # the lane's picture aside (its counts are grouped), one read ranks all 30
    rank_reads = [s for s in statements
                  if "row_number" in s or ("count(" in s and "GROUP BY" not in s)]
    assert len(rank_reads) == 1 and "row_number" in rank_reads[0]


def test_a_fresh_place_is_known_without_reading(repos: Repos, monkeypatch):
    """``known`` (what an event loop may ask) answers as ``of`` from what was read
    within the period, and nothing once any of it is older."""
    clock = Clock()
    monkeypatch.setattr(module.time, "monotonic", clock)
    pipeline = "board-" + uuid.uuid4().hex[:8]
    jobs = queued(repos, pipeline, [repos.new_tenant()], 5)

    class Fleet:  # one live worker serves the pipeline
        def counts(self) -> dict[str, int]:
            return {pipeline: 1}

    standings = Standings(StandingRepository(repos.sessions), fleet=Fleet(), ttl_s=2.0)
    assert standings.known(jobs[0]) is None  # nothing read yet
    [standings.of(j) for j in jobs]  # asked about: on the board from its next reading
    clock.now += 2.0
    read = [standings.of(j) for j in jobs]  # the board now holds all five
    statements: list[str] = []
    engine = repos.sessions.kw["bind"]
    listener = lambda *a: statements.append(a[2])  # noqa: E731
    event.listen(engine, "before_cursor_execute", listener)
    try:
        assert [standings.known(j) for j in jobs] == read
    finally:
        event.remove(engine, "before_cursor_execute", listener)
    assert statements == []
    clock.now += 2.0
    assert standings.known(jobs[0]) is None  # stale: read again through ``of``
