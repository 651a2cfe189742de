"""Each pytest-xdist worker owns its services: two workers of a nested ``pytest -n 2``
each start a stack, submit a job and get their own result back, and neither finds the
other's mark in its Redis database. The same probe, with both workers handed one
database (as the suite's old pool of numbers on one server did), fails."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .services import ROOT, RedisServer, free_port


def nested_run(probe_dir: Path, **env: str) -> subprocess.CompletedProcess:
    probe_dir.mkdir()
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("OMNIJOBS_", "PYTEST_XDIST", "PYTEST_CURRENT"))}
    base.update(PROBE_DIR=str(probe_dir), OMNIJOBS_TEST_SLICE_OFFSET="14", **env)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "each", "-p", "no:cacheprovider",
         "-q",         "--basetemp", str(probe_dir.parent / f"{probe_dir.name}-tmp"),
         "tests/xdist_probe.py"],
        cwd=ROOT, env=base, capture_output=True, text=True, timeout=400)


def test_two_workers_each_get_their_own_redis_database_and_result(tmp_path):
    out = nested_run(tmp_path / "probe")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    workers = sorted(p.name for p in (tmp_path / "probe").iterdir() if "." not in p.name)
    assert workers == ["gw0", "gw1"], workers
    urls = {(tmp_path / "probe" / w).read_text() for w in workers}
    assert len(urls) == 2, urls  # two servers, not two numbers on one
    jobs = [(tmp_path / "probe" / f"{w}.job").read_text() for w in workers]
    assert all(jobs), jobs


def test_the_probe_fails_when_both_workers_share_one_database(tmp_path):
    server = RedisServer(tmp_path / "redis", port=free_port()).start()
    try:
        out = nested_run(tmp_path / "probe", OMNIJOBS_TEST_REDIS=server.url.rsplit("/", 1)[0],
                         PROBE_SHARED_DB="1")
    finally:
        server.stop()
    assert out.returncode == 1, out.stdout[-4000:]
    assert out.stdout.count("shares its Redis database") >= 1, out.stdout[-4000:]
