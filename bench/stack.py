"""A small production-mode stack for one-off benchmarks: its own PostgreSQL database,
SeaweedFS, the API and one more process (a worker or maintenance), and a key.

The fast-path harness (bench/services.py) runs several trees side by side; the single-tree
benchmarks (time to first byte, batch enqueue) need only this.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.conftest import stack_env
from tests.services import (
    create_database,
    drop_database,
    free_port,
    redis_url,
    spawn,
    start_seaweedfs,
    wait_until,
)


@dataclass
class Stack:
    base_url: str
    key: str
    env: dict[str, str]
    home: Path
    broker_url: str
    procs: dict


def spawn_key(env: dict[str, str], home: Path) -> str:
    proc = spawn("keys", ["keys", "create", "--tenant", "bench"], env, home)
    proc.proc.wait(60)
    return proc.log.read_text().strip().splitlines()[-1]


@contextmanager
def local_stack(pipelines: str, role: str, argv: list[str],
                ready_s: float = 120) -> Iterator[Stack]:
    """``role`` runs ``omnijobs <argv>`` beside the API; both are ready when this yields.
    The submit rate limit is off: the benchmarks measure the path, not the limiter."""
    home = Path(tempfile.mkdtemp(prefix="omnijobs-bench-"))
    pg, broker_url = create_database(), redis_url()
    from storage.migrate import upgrade

    upgrade(pg)
    sw = start_seaweedfs(home / "seaweedfs")
    env = stack_env(pg, broker_url, sw, home, OMNIJOBS_PIPELINES=pipelines,
                    OMNIJOBS_TENANT_SUBMITS_PER_S="0")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    procs = {"api": spawn("api", ["api", "--port", str(port)], env, home),
             role: spawn(role, argv, env, home)}
    try:
        wait_until(lambda: httpx.get(f"{base}/readyz").status_code == 200, 60, "API")
        wait_until(lambda: "ready" in procs[role].log.read_text(), ready_s, role)
        yield Stack(base, spawn_key(env, home), env, home, broker_url, procs)
    finally:
        for proc in procs.values():
            proc.stop()
        sw.stop()
        drop_database(pg)
        shutil.rmtree(home, ignore_errors=True)
