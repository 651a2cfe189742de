"""What does a scrape of the fleet's gauges cost at 100,000 queued jobs?

Two databases side by side in the same run, each with its own maintenance process
serving the gauges (``omnijobs maintenance --metrics-port``, the gauges' cache off, so
every scrape reads the database): one migrated and empty, the baseline, and one holding
``--queued`` jobs waiting (half of them a batch's, over two pipelines) beside
``--finished`` jobs completed within the rate window, vacuumed and analysed as a live
database would be. Scrapes alternate between the two (the same machine noise for both);
the figure is p50 and p95 of the scrape's wall time on each, and their ratio. Beside it,
in this process and interleaved the same way, the read alone (the statements a scrape
runs, without the HTTP server and the maintenance process's other threads) and how many
statements it is (the same on both: the cost follows the queue through index scans,
never one statement per job).

Run: .venv/bin/python -m bench.fleet_scrape [--queued 100000] [--finished 50000]
     [--scrapes 40] [--results-dir bench/results]
Needs PostgreSQL and Redis as for the tests.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
from sqlalchemy import event, text

from core.settings import Settings
from storage.db import make_engine, make_sessionmaker
from storage.migrate import upgrade
from storage.repositories import QueueRepository, WorkerRepository
from tests.fleet.conftest import light_env
from tests.services import create_database, drop_database, free_port, redis_url, spawn, wait_until

FILL = """
INSERT INTO tenants (id, name, created_at) VALUES ('bench', 'bench', now());
INSERT INTO batches (id, tenant_id, endpoint, input_file_id, completion_window, status,
    total, completed, failed, rejected, created_at, expires_at)
  VALUES ('batch_bench', 'bench', '/v1/audio/speech', 'file-bench', '24h', 'in_progress',
          0, 0, 0, 0, now(), now() + interval '1 day');
INSERT INTO jobs (id, tenant_id, kind, model, pipeline, status, progress, request, attempts,
    max_attempts, created_at, updated_at, batch_id)
  SELECT 'job_q' || i, 'bench', 'speech', 'tts-1',
         CASE WHEN i % 4 < 2 THEN 'piper-joe' ELSE 'reference-t2va' END, 'queued', 0, '{}',
         0, 3, now() - (i || ' milliseconds')::interval, now(),
         CASE WHEN i % 2 = 0 THEN 'batch_bench' END
  FROM generate_series(1, :queued) AS i;
INSERT INTO jobs (id, tenant_id, kind, model, pipeline, status, progress, request, attempts,
    max_attempts, created_at, updated_at, completed_at, batch_id)
  SELECT 'job_c' || i, 'bench', 'speech', 'tts-1', 'piper-joe', 'completed', 100, '{}', 1, 3,
         now(), now(), now() - ((i % 240) || ' seconds')::interval,
         CASE WHEN i % 2 = 0 THEN 'batch_bench' END
  FROM generate_series(1, :finished) AS i;
"""


def fill(url: str, queued: int, finished: int) -> None:
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            for statement in filter(str.strip, FILL.split(";")):
                conn.execute(text(statement), {"queued": queued, "finished": finished})
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE jobs"))
    finally:
        engine.dispose()


class Reader:
    """One read of the gauges in this process, as the maintenance process makes it
    (signals + the registry), on a database of its own: its statements counted."""

    def __init__(self, url: str) -> None:
        self.engine = make_engine(url)
        self.statements = 0
        event.listen(self.engine, "before_cursor_execute", self._count)
        sessions = make_sessionmaker(self.engine)
        self.queues, self.workers = QueueRepository(sessions), WorkerRepository(sessions)
        self.settings = Settings(database_url=url)

    def _count(self, *_args) -> None:
        self.statements += 1

    def read_ms(self) -> float:
        started = time.perf_counter()
        self.queues.signals(self.settings.pipelines, self.settings.fleet_rate_window_s)
        self.workers.serving(self.settings.pipelines)
        return (time.perf_counter() - started) * 1000


def scrape_ms(url: str) -> float:
    started = time.perf_counter()
    resp = httpx.get(url, timeout=60)
    elapsed = (time.perf_counter() - started) * 1000
    assert resp.status_code == 200 and "omnijobs_queue_signals_ok 1.0" in resp.text, resp.text
    return elapsed


def summary(samples: list[float]) -> dict:
    ordered = sorted(samples)
    return {"p50_ms": round(statistics.median(ordered), 2),
            "p95_ms": round(ordered[math.ceil(0.95 * len(ordered)) - 1], 2),  # nearest rank
            "n": len(ordered)}


def run(queued: int, finished: int, scrapes: int) -> dict:
    home = Path(tempfile.mkdtemp(prefix="omnijobs-bench-fleet-"))
    urls = {"empty": create_database(), "loaded": create_database()}
    procs = {}
    try:
        for url in urls.values():
            upgrade(url)
        fill(urls["loaded"], queued, finished)
        ports = {}
        for side, url in urls.items():
            ports[side] = free_port()
            env = light_env(url, redis_url(), home / side, OMNIJOBS_FLEET_METRICS_CACHE_S="0")
            (home / side).mkdir(parents=True)
            procs[side] = spawn(f"maintenance-{side}", ["maintenance", "--metrics-port",
                                                        str(ports[side])], env, home)
        metrics = {side: f"http://127.0.0.1:{p}/metrics" for side, p in ports.items()}
        for side, url in metrics.items():
            wait_until(lambda u=url: httpx.get(u, timeout=5).status_code == 200, 60, side)
        readers = {side: Reader(url) for side, url in urls.items()}
        times: dict[str, list[float]] = {"empty": [], "loaded": []}
        reads: dict[str, list[float]] = {"empty": [], "loaded": []}
        for side in metrics:  # a warm-up each
            scrape_ms(metrics[side])
            readers[side].read_ms()
        for _ in range(scrapes):
            for side in ("empty", "loaded"):
                times[side].append(scrape_ms(metrics[side]))
                reads[side].append(readers[side].read_ms())
        result = {side: summary(t) for side, t in times.items()}
        result["ratio_p50"] = round(result["loaded"]["p50_ms"] / result["empty"]["p50_ms"], 2)
        result["read"] = {side: summary(t) for side, t in reads.items()}
        result["read"]["ratio_p50"] = round(result["read"]["loaded"]["p50_ms"]
                                            / result["read"]["empty"]["p50_ms"], 2)
        result["statements"] = {side: readers[side].statements // (scrapes + 1)
                                for side in readers}
        for reader in readers.values():
            reader.engine.dispose()
        result.update(queued=queued, finished=finished, scrapes=scrapes,
                      at=datetime.now(UTC).isoformat(timespec="seconds"))
        return result
    finally:
        for proc in procs.values():
            proc.stop()
        for url in urls.values():
            drop_database(url)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queued", type=int, default=100_000)
    parser.add_argument("--finished", type=int, default=50_000)
    parser.add_argument("--scrapes", type=int, default=40)
    parser.add_argument("--results-dir", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    result = run(args.queued, args.finished, args.scrapes)
    args.results_dir.mkdir(parents=True, exist_ok=True)
    out = args.results_dir / f"fleet-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    out.write_text(json.dumps(result, indent=2))
    e, lo = result["empty"], result["loaded"]
    print(f"scrape of the fleet gauges, {args.queued:,} queued + {args.finished:,} finished "
          f"vs an empty database ({args.scrapes} alternating scrapes each):\n"
          f"  empty:  p50 {e['p50_ms']} ms, p95 {e['p95_ms']} ms\n"
          f"  loaded: p50 {lo['p50_ms']} ms, p95 {lo['p95_ms']} ms\n"
          f"  ratio (p50): {result['ratio_p50']}x\n"
          f"the read alone (in this process, the same statements): empty p50 "
          f"{result['read']['empty']['p50_ms']} ms, loaded p50 "
          f"{result['read']['loaded']['p50_ms']} ms, ratio {result['read']['ratio_p50']}x; "
          f"SQL statements per read: {result['statements']['empty']} empty, "
          f"{result['statements']['loaded']} loaded\n"
          f"  written to {out}")


if __name__ == "__main__":
    main()
