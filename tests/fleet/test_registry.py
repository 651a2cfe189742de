"""The worker registry against real processes: each worker and the maintenance process
heartbeat their row; ``omnijobs workers`` lists them; ``/readyz`` names an enabled
pipeline no live worker serves; a queued job says it is waiting for a worker; a worker
killed without a word drops out after its heartbeat period."""

from __future__ import annotations

import os
import signal
import socket
from importlib.metadata import version

import httpx

from storage.db import make_engine, make_sessionmaker
from storage.repositories import WorkerRepository
from storage.views import WAITING_FOR_A_WORKER

from ..services import wait_until
from .conftest import FleetStack, submit


def children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def readyz(fleet: FleetStack) -> dict:
    resp = httpx.get(f"{fleet.base_url}/readyz", timeout=10)
    assert resp.status_code == 200, resp.text  # an unserved pipeline is reported, not a 503
    return resp.json()


def test_the_registry_follows_a_worker_from_start_to_death(fleet: FleetStack):
    registry = WorkerRepository(make_sessionmaker(make_engine(fleet.db_url)))
    assert "test-slow" in readyz(fleet)["unserved"]
    with fleet.client(fleet.new_key("registry")) as c:
        job_id = submit(c, "test-slow")
        wait_until(lambda: c.get(f"/v1/jobs/{job_id}").json()["status_detail"]
                   == WAITING_FOR_A_WORKER, 20, "the job to say it waits for a worker")

        worker = fleet.start_worker("registry-worker", "test-slow")
        [child] = children(worker.proc.pid)

        def mine():
            return [w for w in registry.live() if w.pid == child]

        wait_until(lambda: mine() and mine()[0].job_id == job_id, 30,
                   "the registry to show the job the worker runs")
        [row] = mine()
        assert (row.role, row.pipelines, row.host, row.device, row.version) == (
            "worker", ("test-slow",), socket.gethostname(), "cpu", version("omnijobs"))
        assert row.draining_at is None and row.started_at <= row.heartbeat_at
        assert row.slots == 1 and [j.id for j in row.in_flight] == [job_id]
        wait_until(lambda: c.get(f"/v1/jobs/{job_id}").json()["status"] == "completed", 60,
                   "the job to complete")
        assert c.get(f"/v1/jobs/{job_id}").json()["status_detail"] is None

    listing = fleet.cli("workers")
    assert any(line.startswith("worker") and f" {child} " in line and "test-slow" in line
               for line in listing.splitlines()), listing
    assert any(line.startswith("maintenance") for line in listing.splitlines()), listing
    ready = readyz(fleet)
    assert "test-slow" not in ready["unserved"] and ready["workers"]["test-slow"] == 1

    for pid in (child, worker.proc.pid):  # killed without a word: no row removal
        os.kill(pid, signal.SIGKILL)
    worker.proc.wait(10)
    wait_until(lambda: "test-slow" in readyz(fleet)["unserved"], 30,
               "the dead worker to drop out")
    assert not mine()
    assert f" {child} " not in fleet.cli("workers")
    dead = [line for line in fleet.cli("workers", "--all").splitlines() if f" {child} " in line]
    assert len(dead) == 1 and " dead " in dead[0]
