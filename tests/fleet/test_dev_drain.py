"""Ctrl-C in ``omnijobs dev`` drains like SIGTERM: the running job completes, the queued
ones stay queued for the next start (none is claimed during the shutdown)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import httpx
from sqlalchemy import create_engine, text

from ..services import ROOT, free_port, wait_until

ASYNC = {"Prefer": "respond-async"}


def test_ctrl_c_in_dev_finishes_the_running_job_and_claims_no_other(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNIJOBS_")}
    env.update(PYTHONPATH=str(ROOT), OMNIJOBS_HOME=str(tmp_path / ".omnijobs"),
               OMNIJOBS_PIPELINE_MODULES='["tests.fake_pipelines"]',
               OMNIJOBS_PIPELINES='["piper-joe", "test-sleep"]')
    log = tmp_path / "dev.log"
    with log.open("wb") as out:  # a session of its own: Ctrl-C goes to its whole group
        dev = subprocess.Popen([sys.executable, "-m", "omnijobs.cli", "dev", "--port",
                                str(port)], cwd=tmp_path, env=env, stdout=out,
                               stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: httpx.get(f"{base}/readyz", timeout=2).status_code == 200, 90,
                   "omnijobs dev")
        wait_until(lambda: log.read_text().count(" ready.") >= 2, 90, "its worker")
        key = (tmp_path / ".omnijobs" / "dev-api-key").read_text().strip()
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"},
                          timeout=30) as c:
            def submit(seconds: str) -> str:
                resp = c.post("/v1/audio/speech", headers=ASYNC,
                              json={"model": "test-sleep", "input": seconds})
                assert resp.status_code == 202, resp.text
                return resp.json()["id"]

            running = submit("4")
            wait_until(lambda: c.get(f"/v1/jobs/{running}").json()["status"] == "running",
                       60, "the job to run")
            waiting = [submit("1") for _ in range(3)]
        os.killpg(dev.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        assert dev.wait(120) == 0
    finally:
        if dev.poll() is None:
            os.killpg(dev.pid, signal.SIGKILL)
    engine = create_engine(f"sqlite:///{tmp_path / '.omnijobs' / 'omnijobs.db'}")
    with engine.connect() as conn:
        status = dict(conn.execute(text("SELECT id, status FROM jobs")).all())
    engine.dispose()
    assert status[running] == "completed", log.read_text()[-3000:]
    assert [status[j] for j in waiting] == ["queued"] * 3, log.read_text()[-3000:]
