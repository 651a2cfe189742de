"""What the processes print, read from the real processes: JSON lines only where logs
are JSON (no Celery banner, no bare shutdown print, no ANSI ``color_message``), one
stop line per process however many signals it gets, Celery's root warning as a record
of the same format, and the reaper naming the job it reclaimed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import httpx
import pytest

from ..services import ROOT, free_port, spawn, wait_until


def records(text: str) -> list[dict]:
    """Every line of ``text`` as a JSON object (failing on one that is not)."""
    parsed = []
    for line in text.splitlines():
        if line.strip():
            try:
                parsed.append(json.loads(line))
            except ValueError:
                pytest.fail(f"not a JSON line: {line!r}\nin:\n{text}")
    return parsed


@pytest.fixture
def embedded_env(tmp_path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNIJOBS_")}
    env.update(PYTHONPATH=str(ROOT), OMNIJOBS_HOME=str(tmp_path / ".omnijobs"))
    subprocess.run([sys.executable, "-m", "omnijobs.cli", "migrate"], env=env, check=True,
                   cwd=tmp_path, capture_output=True, timeout=60)
    return env


def test_json_logs_from_start_to_a_twice_signalled_stop(embedded_env, tmp_path):
    """Worker, maintenance and API with JSON logs (the default outside ``omnijobs dev``),
    each stopped with two SIGTERMs, as an impatient supervisor sends them."""
    port = free_port()
    procs = {"worker": spawn("worker", ["worker"], embedded_env, tmp_path),
             "maintenance": spawn("maintenance", ["maintenance"], embedded_env, tmp_path),
             "api": spawn("api", ["api", "--port", str(port)], embedded_env, tmp_path)}
    try:
        for name in ("worker", "maintenance"):
            wait_until(lambda n=name: " ready." in procs[n].log.read_text(), 90, name)
        wait_until(lambda: httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200,
                   60, "API")
        for _ in range(2):
            for proc in procs.values():
                if proc.proc.poll() is None:
                    proc.proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            proc.proc.wait(60)
    finally:
        for proc in procs.values():
            proc.stop()
    logs = {name: records(proc.log.read_text()) for name, proc in procs.items()}
    for name, lines in logs.items():
        assert not any("color_message" in r for r in lines), (name, lines)
        assert not any("superuser" in r["message"] for r in lines), (name, lines)
    assert "Warm shutdown" not in "".join(p.log.read_text() for p in procs.values())
    stops = [r for r in logs["worker"] if r["message"].startswith("draining")]
    assert len(stops) == 1, logs["worker"]
    stops = [r for r in logs["maintenance"] if r["message"].startswith("stopping")]
    assert len(stops) == 1, logs["maintenance"]
    assert any(r["message"].startswith("Uvicorn running on") for r in logs["api"])


def test_the_production_stack_logs_json_lines_only(stack):
    """The shared stack's API, worker and maintenance process, as they have run so far;
    run as root (as here), Celery's warning about it is one record among them."""
    for name in ("api", "worker", "maintenance"):
        lines = records(stack.processes[name].log.read_text())
        assert lines and not any("color_message" in r for r in lines), name
        root = [r for r in lines if "superuser privileges" in r["message"]]
        if name != "api" and os.geteuid() == 0:
            assert root and {r["level"] for r in root} == {"WARNING"}, (name, root)
        else:
            assert root == []
