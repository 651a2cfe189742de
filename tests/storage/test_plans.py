"""The reads whose cost must not grow with the tables' history use an index for what
they select, not a filter over rows read and thrown away.

Each test runs the repository's own statement (captured as it is sent) under EXPLAIN on
a database holding a history as bench/costflat_load.py writes it (small, but enough for
the planner to prefer the right index), and checks the plan, not a time.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

import pytest
from sqlalchemy import event, text

from bench.costflat_load import load
from storage.db import make_engine, make_sessionmaker
from storage.records import JobFilter
from storage.repositories import JobRepository, KeyRepository

from ..conftest import migrated_database


@pytest.fixture(scope="module")
def loaded() -> Iterator[tuple[str, str]]:
    """A database with the working set and 22,000 jobs of history: (url, tenant)."""
    for url in migrated_database():
        tenant, _ = KeyRepository(make_sessionmaker(make_engine(url))).create_key("plans")
        load(url, tenant, 0.02)
        yield url, tenant


def statements(url: str, call) -> list[tuple[str, dict]]:
    """The SELECTs on ``jobs`` that ``call(repository)`` sends, with their parameters."""
    engine = make_engine(url)
    sent: list[tuple[str, dict]] = []

    @event.listens_for(engine, "before_cursor_execute")
    def capture(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("SELECT") and "FROM jobs" in statement:
            sent.append((statement, parameters))

    call(JobRepository(make_sessionmaker(engine)))
    engine.dispose()
    return sent


def plan(url: str, statement: str, parameters) -> dict:
    """EXPLAIN ANALYZE of one statement (its rows read, kept and thrown away)."""
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, parameters).fetchone()
        return row[0][0]["Plan"]


def nodes(node: dict) -> Iterator[dict]:
    yield node
    for child in node.get("Plans", ()):
        yield from nodes(child)


def jobs_scan(p: dict) -> dict:
    [scan] = [n for n in nodes(p) if n.get("Relation Name") == "jobs"]
    return scan


def one_plan(url: str, call) -> dict:
    [(statement, parameters)] = statements(url, call)
    return plan(url, statement, parameters)


def cursor(url: str, tenant: str, depth: int) -> str:
    with make_engine(url).connect() as conn:
        return conn.execute(text(
            "SELECT id FROM jobs WHERE tenant_id = :t ORDER BY created_at DESC, id DESC "
            "OFFSET :n LIMIT 1"), {"t": tenant, "n": depth - 1}).scalar_one()


def test_a_deep_page_starts_at_its_cursor(loaded):
    """Page 100's rows are an index range that begins at the cursor: none of the 9,900
    rows before it is read and discarded."""
    url, tenant = loaded
    after = cursor(url, tenant, 9900)
    [_lookup, (statement, params)] = statements(
        url, lambda jobs: jobs.find(JobFilter(tenant), after=after, limit=100))
    scan = jobs_scan(plan(url, statement, params))
    assert scan["Index Name"] == "ix_jobs_tenant_created", scan
    assert "created_at" in scan["Index Cond"] and "id" in scan["Index Cond"], scan
    assert scan.get("Rows Removed by Filter", 0) == 0, scan
    assert scan["Actual Rows"] == 101  # the page and the one that says there is more


def test_retention_reads_only_outputs_not_yet_deleted(loaded):
    """outputs_to_expire reads the due rows of an index of undeleted outputs, not every
    expired job whose objects went long ago."""
    url, _ = loaded
    p = one_plan(url, lambda jobs: jobs.outputs_to_expire())
    scan = jobs_scan(p)
    assert scan["Index Name"] == "ix_jobs_outputs_due", scan
    assert scan.get("Rows Removed by Filter", 0) == 0, scan
    assert scan["Actual Rows"] >= 30  # the working set's due ones


def test_the_stale_queued_sweep_reads_queued_jobs_only(loaded):
    """No scan of the whole table, no sort: an index of queued jobs by their last
    change, read from the oldest."""
    url, _ = loaded
    p = one_plan(url, lambda jobs: jobs.stale_queued(900.0))
    scan = jobs_scan(p)
    assert scan["Node Type"] in ("Index Scan", "Index Only Scan"), scan
    assert scan["Index Name"] == "ix_jobs_queued_updated", scan
    assert scan.get("Rows Removed by Filter", 0) == 0, scan
    assert not [n for n in nodes(p) if n["Node Type"] == "Sort"], p
    assert p["Actual Rows"] == 30  # the working set's stale ones


@pytest.mark.skipif(sqlite3.sqlite_version_info < (3, 15), reason="row values: SQLite 3.15")
def test_sqlite_pages_on_the_index_range_too(sqlite_url):
    """The embedded mode's SQLite sees the same row-value cursor as an index range."""
    engine = make_engine(sqlite_url)
    tenant, _ = KeyRepository(make_sessionmaker(engine)).create_key("plans")
    repo = JobRepository(make_sessionmaker(engine))
    [(statement, params)] = statements(
        sqlite_url, lambda jobs: jobs.find(JobFilter(tenant), after=_any_job(repo, tenant),
                                           limit=10))[1:]
    with engine.connect() as conn:
        detail = " ".join(r[-1] for r in conn.exec_driver_sql(
            "EXPLAIN QUERY PLAN " + statement, params))
    assert "ix_jobs_tenant_created (tenant_id=? AND (created_at,id)<(?,?))" in detail, detail


def _any_job(repo: JobRepository, tenant: str) -> str:
    from core.jobs import JobKind
    from storage.records import NewJob

    job, _ = repo.create(NewJob(tenant_id=tenant, kind=JobKind.SPEECH, model="piper-joe",
                                pipeline="piper-joe", queue="q", request={"input": "hi"},
                                metadata=None, max_attempts=1))
    return job.id


@pytest.fixture(scope="module")
def crowded() -> Iterator[str]:
    """A database with 2,000 tenants that have never queued anything."""
    for url in migrated_database():
        with make_engine(url).begin() as conn:
            conn.execute(text(
                "INSERT INTO tenants (id, name, created_at) SELECT 'idle-' || i, "
                "'idle-' || i, now() FROM generate_series(1, 2000) AS i"))
        yield url


def test_a_claim_probes_the_waiting_tenants_only(crowded):
    """The fair claim walks the lane's index from one waiting tenant to the next: three
    tenants waiting among 2,000 cost a handful of probes, not one per tenant, so the
    claim does not slow down as tenants accumulate."""
    from core.jobs import JobKind
    from storage.records import NewJob

    engine = make_engine(crowded)
    sessions = make_sessionmaker(engine)
    jobs = JobRepository(sessions)
    waiting = [KeyRepository(sessions).create_key(f"waiting-{i}")[0] for i in range(3)]
    tokens = [jobs.create(NewJob(tenant_id=t, kind=JobKind.SPEECH, model="m",
                                 pipeline="crowded", queue="q", request={"input": "hi"},
                                 metadata=None, max_attempts=1))[1].token
              for t in waiting for _ in range(2)]
    sent: list[tuple[str, dict]] = []

    @event.listens_for(engine, "before_cursor_execute")
    def capture(conn, cursor, statement, parameters, context, executemany):
        if "FOR UPDATE SKIP LOCKED" in statement:
            sent.append((statement, parameters))

    claimed = jobs.claim_next(tokens[0], "w", 60)
    assert claimed is not None and claimed.tenant_id in waiting
    [(statement, params)] = sent
    with engine.connect() as conn:  # a token still held, so the statement runs whole
        params["token"] = conn.execute(text(
            "SELECT dispatch_token FROM jobs WHERE pipeline = 'crowded' AND "
            "status = 'queued' LIMIT 1")).scalar_one()
    engine.dispose()
    import psycopg

    with psycopg.connect(crowded) as conn:  # EXPLAIN ANALYZE runs it: rolled back
        p = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, params
                         ).fetchone()[0][0]["Plan"]
        conn.rollback()
    probes = sum(n.get("Actual Loops", 0) for n in nodes(p)
                 if n.get("Index Name", "").startswith("ix_jobs_fair_"))
    assert 0 < probes <= 2 * len(waiting) + 4, p
    # the tenants table: only the claimed job's own row (its weight), not every tenant
    assert sum(n["Actual Rows"] * n["Actual Loops"] for n in nodes(p)
               if n.get("Relation Name") == "tenants") <= 1, p
