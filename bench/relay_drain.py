"""How fast does the outbox relay re-send a backlog a broker outage left behind?

One database (PostgreSQL) holding ``--messages`` due render messages of a batch's jobs
(what a 50,000-line batch leaves when the broker was down as it was queued) plus a few
interactive ones, and one Redis broker of its own. The relay as it is
(``tasks.recovery.relay_outbox``: pages of 2,000, one broker round trip each, looping
until nothing is due or its 3 s budget is spent) drains the backlog; then, on the same
backlog restored, the relay as it was (one read of 100 per run, a publish per message),
for ``--old-runs`` runs. Figures: messages per second inside the relay for each, and the
drain rate as the maintenance process schedules it (a run every 5 s): the old relay's
100 per run is 20 messages a second whatever its speed inside a run.

Run: .venv/bin/python -m bench.relay_drain [--messages 50000] [--old-runs 5]
     [--results-dir bench/results]
Needs PostgreSQL and Redis as for the tests.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import redis
from sqlalchemy import text

from core.errors import ServiceUnavailable
from core.settings import Settings
from storage.db import make_engine
from storage.migrate import upgrade
from tasks.app import make_celery
from tasks.dispatch import publish
from tasks.maintenance import PERIODS
from tasks.recovery import relay_outbox
from tasks.runtime import WorkerRuntime
from tests.services import create_database, drop_database, redis_url

PIPELINE, QUEUE = "piper-joe", "pipeline.piper-joe"
FILL = """
INSERT INTO tenants (id, name, created_at) VALUES ('bench', 'bench', now());
INSERT INTO jobs (id, tenant_id, kind, model, pipeline, status, progress, request, attempts,
    max_attempts, created_at, updated_at)
  SELECT 'job_r' || i, 'bench', 'speech', 'tts-1', 'piper-joe', 'queued', 0, '{}', 0, 3,
         now(), now() FROM generate_series(1, :messages) AS i;
INSERT INTO outbox (topic, job_id, queue, payload, created_at, available_at)
  SELECT 'render', 'job_r' || i, 'pipeline.piper-joe',
         json_build_object('job_id', 'job_r' || i, 'token', md5(i::text),
                           'lane', CASE WHEN i % 1000 = 0 THEN NULL ELSE 'bulk' END),
         now() - interval '1 minute', now() - interval '1 minute'
  FROM generate_series(1, :messages) AS i
"""


def old_relay(rt: WorkerRuntime, app) -> int:
    """The relay as it was: one page of 100 by id, a broker publish per message."""
    published = []
    for msg in rt.outbox.due(grace_s=rt.settings.outbox_grace_s):
        try:
            publish(app, msg)
        except ServiceUnavailable:
            break
        published.append(msg.id)
    rt.outbox.mark_published(published)
    return len(published)


def restore(url: str, broker: str) -> None:
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE outbox SET published_at = NULL"))
    engine.dispose()
    redis.Redis.from_url(broker).flushdb()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--old-runs", type=int, default=5)
    parser.add_argument("--results-dir", type=Path, default=None)
    args = parser.parse_args()
    url, broker = create_database(), redis_url()
    try:
        upgrade(url)
        engine = make_engine(url)
        with engine.begin() as conn:
            for statement in filter(str.strip, FILL.split(";")):
                conn.execute(text(statement), {"messages": args.messages})
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE outbox"))
        engine.dispose()
        with tempfile.TemporaryDirectory() as home:
            settings = Settings(home=Path(home), database_url=url, broker_url=broker,
                                outbox_grace_s=0)
            rt, app = WorkerRuntime(settings), make_celery(settings, with_tasks=False)

            runs, inside = [], 0.0
            while True:
                t0 = time.perf_counter()
                sent = relay_outbox(rt, app)
                inside += time.perf_counter() - t0
                if not sent:
                    break
                runs.append(sent)
            queued = sum(redis.Redis.from_url(broker).llen(k) for k in
                         redis.Redis.from_url(broker).keys(f"{QUEUE}*"))
            new = {"messages": sum(runs), "in_broker": queued, "runs": len(runs),
                   "seconds_inside": round(inside, 3),
                   "per_s_inside": round(sum(runs) / inside),
                   # runs of at most the budget, one every period: what maintenance does
                   "per_s_scheduled": round(sum(runs) / (
                       (len(runs) - 1) * PERIODS["relay"] + inside / len(runs)))}

            restore(url, broker)
            rates = []
            for _ in range(args.old_runs):
                t0 = time.perf_counter()
                sent = old_relay(rt, app)
                rates.append(sent / (time.perf_counter() - t0))
            old = {"messages_per_run": 100, "per_s_inside": round(statistics.median(rates)),
                   "per_s_scheduled": round(100 / PERIODS["relay"])}
    finally:
        drop_database(url)
    result = {"backlog": args.messages, "new": new, "old": old,
              "ratio_scheduled": round(new["per_s_scheduled"] / old["per_s_scheduled"], 1),
              "ratio_inside": round(new["per_s_inside"] / old["per_s_inside"], 2)}
    print(json.dumps(result, indent=1))
    if args.results_dir:
        args.results_dir.mkdir(parents=True, exist_ok=True)
        (args.results_dir / "relay_drain.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
