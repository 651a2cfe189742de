"""What does the fair claim cost at 100,000 queued jobs across 100 tenants?

One PostgreSQL database holding ``--queued`` jobs waiting in one pipeline's interactive
lane, spread over ``--tenants`` tenants (each with a service record, as after a day of
work), vacuumed and analysed as a live database would be. Claims alternate between the
fair claim (``JobRepository.claim_next``: the message's token, the lane's clock, the
fairest tenant's oldest ready job, the service charged, the attempt opened) and the
claim the render task made before fair share (``FIFO_CLAIM`` below, kept here for the
side-by-side: a compare-and-set on the message's own job and token, the attempt opened),
on the same database in the same run, so both see the same queue and the same noise.
Each claim is one repository call (its whole transaction); the figures are p50 and p99
of its wall time, their ratio, and the statements each sends.

Run: .venv/bin/python -m bench.fair_claim [--queued 100000] [--tenants 100]
     [--claims 400] [--results-dir bench/results]
Needs PostgreSQL as for the tests.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import bindparam, event, func, text, update

from core.jobs import JobStatus
from storage.db import make_engine, make_sessionmaker
from storage.migrate import upgrade
from storage.models import Job, UTCDateTime
from storage.repositories import JobRepository
from storage.repositories import attempts as history
from storage.repositories.fair import CLAIMED as _CLAIMED
from tests.services import create_database, drop_database

FILL = """
INSERT INTO tenants (id, name, created_at, share_weight)
  SELECT 'tenant_' || t, 'tenant ' || t, now(), 1 FROM generate_series(1, :tenants) AS t;
INSERT INTO tenant_service (pipeline, lane, tenant_id, pass)
  SELECT 'bench', 'interactive', 'tenant_' || t, t % 7 FROM generate_series(1, :tenants) AS t;
INSERT INTO lane_clocks (pipeline, lane, vtime) VALUES ('bench', 'interactive', 3);
INSERT INTO jobs (id, tenant_id, kind, model, pipeline, status, progress, request, attempts,
    max_attempts, created_at, updated_at, dispatch_token)
  SELECT 'job_q' || lpad(i::text, 7, '0'), 'tenant_' || (1 + i % :tenants), 'speech',
         'bench', 'bench', 'queued', 0, '{}', 0, 3,
         now() - interval '1 hour' + (i || ' milliseconds')::interval, now(), md5(i::text)
  FROM generate_series(1, :queued) AS i;
"""

# The render task's claim before fair share: this job, if it is queued with this token.
FIFO_CLAIM = update(Job).where(
    Job.id == bindparam("job_id"), Job.status == JobStatus.QUEUED.value,
    Job.dispatch_token == bindparam("token")).values(
    status=JobStatus.RUNNING.value, attempts=Job.attempts + 1,
    worker_id=bindparam("worker_id"), lease_expires_at=bindparam("lease", type_=UTCDateTime()),
    updated_at=bindparam("now", type_=UTCDateTime()),
    started_at=func.coalesce(Job.started_at, bindparam("now", type_=UTCDateTime())),
    error_code=None, error_message=None).returning(*_CLAIMED)


def fifo_claim(sessions, job_id: str, token: str) -> bool:
    now = datetime.now(UTC)
    with sessions.begin() as s:
        job = s.connection().execute(FIFO_CLAIM, {
            "job_id": job_id, "token": token, "worker_id": "bench", "now": now,
            "lease": now + timedelta(seconds=60)}).one_or_none()
        if job is None:
            return False
        history.open_attempt(s, job_id, job.attempts, "bench", now)
        return True


def fill(url: str, queued: int, tenants: int) -> None:
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            for statement in filter(str.strip, FILL.split(";")):
                conn.execute(text(statement), {"queued": queued, "tenants": tenants})
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE"))
    finally:
        engine.dispose()


def summary(samples: list[float], statements: list[int]) -> dict:
    ms = sorted(s * 1000 for s in samples)
    return {"p50_ms": round(statistics.median(ms), 3),
            "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 3),
            "statements": statistics.median(statements)}


def run(queued: int, tenants: int, claims: int) -> dict:
    url = create_database()
    try:
        upgrade(url)
        fill(url, queued, tenants)
        engine = make_engine(url)
        counted = [0]
        event.listen(engine, "before_cursor_execute",
                     lambda *a, **k: counted.__setitem__(0, counted[0] + 1))
        sessions = make_sessionmaker(engine)
        jobs = JobRepository(sessions)
        with engine.connect() as conn:
            # The newest jobs: the fair claims take each tenant's oldest, never these.
            newest = conn.execute(text(
                "SELECT id, dispatch_token FROM jobs ORDER BY created_at DESC LIMIT :n"),
                {"n": 2 * claims}).all()
        fifo, tokens = newest[:claims], [t for _, t in newest[claims:]]
        times: dict[str, list[float]] = {"fair": [], "fifo": []}
        stmts: dict[str, list[int]] = {"fair": [], "fifo": []}
        served: dict[str, int] = {}
        for (job_id, token), fair_token in zip(fifo, tokens, strict=True):
            for name in ("fifo", "fair"):
                counted[0] = 0
                start = time.perf_counter()
                if name == "fifo":
                    assert fifo_claim(sessions, job_id, token)
                else:
                    job = jobs.claim_next(fair_token, "bench", 60)
                    assert job is not None
                    served[job.tenant_id] = served.get(job.tenant_id, 0) + 1
                times[name].append(time.perf_counter() - start)
                stmts[name].append(counted[0])
        engine.dispose()
        fair, base = summary(times["fair"], stmts["fair"]), summary(times["fifo"], stmts["fifo"])
        return {"queued": queued, "tenants": tenants, "claims": claims, "fair": fair,
                "fifo": base, "ratio_p50": round(fair["p50_ms"] / base["p50_ms"], 2),
                "ratio_p99": round(fair["p99_ms"] / base["p99_ms"], 2),
                "tenants_served": len(served), "most_claims_one_tenant": max(served.values()),
                "at": datetime.now(UTC).isoformat(timespec="seconds")}
    finally:
        drop_database(url)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queued", type=int, default=100_000)
    parser.add_argument("--tenants", type=int, default=100)
    parser.add_argument("--claims", type=int, default=400)
    parser.add_argument("--results-dir", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    result = run(args.queued, args.tenants, args.claims)
    args.results_dir.mkdir(parents=True, exist_ok=True)
    out = args.results_dir / f"fair-claim-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    out.write_text(json.dumps(result, indent=2))
    f, b = result["fair"], result["fifo"]
    print(f"claims at {args.queued:,} queued jobs across {args.tenants} tenants "
          f"({args.claims} of each, alternating):\n"
          f"  fair claim: p50 {f['p50_ms']} ms, p99 {f['p99_ms']} ms, "
          f"{f['statements']:g} statements\n"
          f"  FIFO claim: p50 {b['p50_ms']} ms, p99 {b['p99_ms']} ms, "
          f"{b['statements']:g} statements\n"
          f"  ratio: p50 {result['ratio_p50']}x, p99 {result['ratio_p99']}x; fair claims "
          f"served {result['tenants_served']} tenants, at most "
          f"{result['most_claims_one_tenant']} claims one tenant\n  written to {out}")


if __name__ == "__main__":
    main()
