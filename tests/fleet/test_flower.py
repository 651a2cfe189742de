"""Flower (the compose file's Celery-level view) against this stack's broker: it lists a
running worker and, from the workers' task events, the render task of a job."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import httpx

from ..services import free_port, wait_until
from .conftest import FleetStack, submit
from .test_drain import child_pid


def test_flower_sees_the_workers_and_their_tasks(fleet: FleetStack, tmp_path):
    worker = fleet.start_worker("flower-worker", "test-sleep")
    port = free_port()
    env = {**os.environ, "FLOWER_UNAUTHENTICATED_API": "true"}
    with (tmp_path / "flower.log").open("wb") as log:
        flower = subprocess.Popen([sys.executable, "-m", "celery",
                                   f"--broker={fleet.env['OMNIJOBS_BROKER_URL']}", "flower",
                                   "--address=127.0.0.1", f"--port={port}"],
                                  env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        name = f"omnijobs-{child_pid(worker)}@{socket.gethostname()}"

        def listed() -> bool:
            return name in httpx.get(f"{base}/api/workers", params={"refresh": "1"},
                                     timeout=10).json()

        wait_until(listed, 60, "Flower to list the worker")
        with fleet.client(fleet.new_key("flower")) as c:
            job_id = submit(c, "test-sleep", "0.2")

            def seen() -> bool:
                tasks = httpx.get(f"{base}/api/tasks", timeout=10).json().values()
                return any(t["name"] == "omnijobs.render" and job_id in (t["args"] or "")
                           and t["worker"] == name for t in tasks)

            wait_until(seen, 60, "Flower to show the job's render task")
    finally:
        flower.terminate()
        flower.wait(20)
        worker.stop()
