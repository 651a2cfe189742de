"""The submit's counts (a tenant's active jobs, a pipeline's queue): read once per
``FRESH_S`` while far from the cap (this process's admissions added in between), on
every group from half the cap on, so the cap holds exactly where it matters; a group far
from every cap reads nothing before its insert.

The clock is the test's own: nothing here waits or times anything.
"""

from __future__ import annotations

import uuid

from sqlalchemy import event, text

from core.errors import TooManyRequests
from core.jobs import JobKind
from storage.db import make_engine, make_sessionmaker
from storage.records import NewJob
from storage.repositories import JobRepository, KeyRepository
from storage.repositories.quotas import FRESH_S, INTERACTIVE, Quota, Quotas


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def setup(url: str, cap: int, pipeline: str | None = None, tenant_cap: int = 1000):
    engine = make_engine(url)
    sessions = make_sessionmaker(engine)
    tenant, _ = KeyRepository(sessions).create_key("quota-" + uuid.uuid4().hex)
    clock = Clock()
    jobs = JobRepository(sessions, Quotas({INTERACTIVE: Quota(tenant_cap, cap)}, clock=clock))
    pipeline = pipeline or "p-" + uuid.uuid4().hex[:8]
    counted: list[tuple[int, int]] = []  # per count statement: (pipeline, tenant) counts

    @event.listens_for(engine, "before_cursor_execute")
    def capture(conn, cursor, statement, parameters, context, executemany):
        if "count(*)" in statement and "LIMIT" in statement:
            counted.append((statement.count("jobs.pipeline ="),
                            statement.count("jobs.tenant_id =")))

    def submit() -> object:
        new = NewJob(tenant_id=tenant, kind=JobKind.SPEECH, model="m", pipeline=pipeline,
                     queue="q", request={"input": "hi"}, metadata=None, max_attempts=1)
        [result] = jobs.create_many([new])
        return result
    return submit, clock, counted, pipeline


def test_far_from_the_cap_the_count_is_read_once_per_period(db_url):
    submit, clock, counted, _ = setup(db_url, cap=100)
    for _ in range(3):
        assert not isinstance(submit(), TooManyRequests)
    assert counted == [(1, 1)]  # counted by the first group, then this process's sums
    clock.now += FRESH_S
    submit()
    assert counted == [(1, 1), (1, 1)]  # the period is over: counted again


def test_from_half_the_cap_every_group_counts_and_the_cap_holds(db_url):
    submit, clock, counted, _ = setup(db_url, cap=6)
    results = [submit() for _ in range(8)]
    # below half (0, 1, 2 queued) the first count serves; from 3 of 6 on, every group
    # counts the queue (the tenant, far from its cap, is still this process's sum) until
    # it is full: the sixth group's count (5) and its admission fill it, so the seventh
    # and eighth are refused without a count until the period ends
    assert counted == [(1, 1)] + [(1, 0)] * 3
    assert [isinstance(r, TooManyRequests) for r in results] == [False] * 6 + [True] * 2
    assert results[-1].code == "queue_full"


def test_a_full_queue_is_refused_without_a_count_until_the_period_ends(db_url):
    """A flood against a full queue costs one count per period, not one per group; room
    made meanwhile is seen at the next count."""
    submit, clock, counted, pipeline = setup(db_url, cap=4)
    other, _, _, _ = setup(db_url, cap=4, pipeline=pipeline)  # another API process
    assert not any(isinstance(other(), TooManyRequests) for _ in range(4))
    flood = [submit() for _ in range(20)]
    assert {getattr(r, "code", None) for r in flood} == {"queue_full"}
    assert counted == [(1, 1)]  # the count that found it full, then nothing
    engine = make_engine(db_url)
    with engine.begin() as conn:  # a worker claims one: room for one more
        conn.execute(text("UPDATE jobs SET status = 'running' WHERE id = ("
                          "SELECT id FROM jobs WHERE pipeline = :p AND status = 'queued' "
                          "LIMIT 1)"), {"p": pipeline})
    engine.dispose()
    assert isinstance(submit(), TooManyRequests)  # within the period: still full
    clock.now += FRESH_S
    assert not isinstance(submit(), TooManyRequests)  # counted again: admitted
    assert counted == [(1, 1), (1, 1)]
    assert isinstance(submit(), TooManyRequests)  # full again, by its own admission


def test_a_tenant_near_its_cap_is_counted_on_every_group(db_url):
    submit, clock, counted, _ = setup(db_url, cap=1000, tenant_cap=4)
    results = [submit() for _ in range(6)]
    assert counted == [(1, 1)] + [(0, 1)] * 4  # from 2 of 4 active on, every group
    assert [isinstance(r, TooManyRequests) for r in results] == [False] * 4 + [True] * 2
    assert results[-1].code == "too_many_active_jobs"


def test_another_process_s_jobs_count_from_the_next_period(db_url):
    """The bound the period sets: jobs another process queued meanwhile are seen at the
    next count, and from then on the cap refuses."""
    submit, clock, counted, pipeline = setup(db_url, cap=10)
    submit()
    other, _, _, _ = setup(db_url, cap=10, pipeline=pipeline)  # another API process
    for _ in range(10):
        other()  # fills the queue to its cap (the first nine admitted)
    assert not isinstance(submit(), TooManyRequests)  # within the period: not yet seen
    clock.now += FRESH_S
    assert isinstance(submit(), TooManyRequests)
    assert counted[-1] == (1, 1)
