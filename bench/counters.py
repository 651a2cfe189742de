"""What one submit costs the database and the broker, counted by the servers themselves.

PostgreSQL's ``pg_stat_database`` (transactions committed and rolled back, sessions
opened) for the run's own database, and Redis's ``INFO commandstats`` for the run's own
``redis-server``, read before and after a load run: the difference divided by the 202s is
the cost per accepted submit. Read-only sessions end in a rollback, so both count. With
a process id, the CPU time that process spent (user + system, from /proc) too.

PostgreSQL 15 flushes an idle backend's statistics up to 10 s late (PGSTAT_IDLE_INTERVAL),
so each read waits SETTLE_S first; with less the counts are approximate.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import psycopg
import redis

SETTLE_S = 11.0
PG_FIELDS = ("xact_commit", "xact_rollback", "sessions")


def _pg(database_url: str) -> dict[str, int]:
    server, name = database_url.rsplit("/", 1)
    # Read from another database of the same server: a session on the measured one counts.
    with psycopg.connect(server + "/postgres", autocommit=True) as conn:
        row = conn.execute(f"SELECT {', '.join(PG_FIELDS)} FROM pg_stat_database "
                           "WHERE datname = %s", (name,)).fetchone()
    return dict(zip(PG_FIELDS, row, strict=True))


def _redis(redis_url: str) -> dict[str, int]:
    stats = redis.Redis.from_url(redis_url).info("commandstats")
    return {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()
            if name not in ("cmdstat_info",)}


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Counters:
    """``with Counters(pg, redis) as c: ...; c.per(accepted)``"""

    def __init__(self, database_url: str, redis_url: str, settle_s: float = SETTLE_S,
                 pid: int | None = None) -> None:
        self.database_url, self.redis_url, self.settle_s = database_url, redis_url, settle_s
        self.pid = pid
        self.delta: dict[str, float] = {}

    def __enter__(self) -> Counters:
        time.sleep(self.settle_s)
        self._before = {**_pg(self.database_url), **_redis(self.redis_url)}
        self._cpu = cpu_seconds(self.pid) if self.pid else 0.0
        return self

    def __exit__(self, *exc) -> None:
        cpu = cpu_seconds(self.pid) - self._cpu if self.pid else 0.0
        time.sleep(self.settle_s)
        after = {**_pg(self.database_url), **_redis(self.redis_url)}
        self.delta = {k: v - self._before.get(k, 0) for k, v in after.items()
                      if v - self._before.get(k, 0)}
        if self.pid:
            self.delta["server_cpu_ms"] = cpu * 1000

    def per(self, accepted: int) -> dict[str, float]:
        """Each counter per accepted submit (transactions, sessions, Redis commands)."""
        if accepted <= 0:
            return {}
        per = {k: round(v / accepted, 3) for k, v in self.delta.items()}
        per["transactions"] = round((self.delta.get("xact_commit", 0)
                                     + self.delta.get("xact_rollback", 0)) / accepted, 3)
        return dict(sorted(per.items()))
