"""Nothing is lost: a broker outage at submit, a worker killed mid-job, a cancel."""

from __future__ import annotations

import json
import signal

import httpx
import pytest

from ..services import free_port, spawn, wait_until
from .helpers import wait_job


@pytest.fixture(scope="module")
def key(stack) -> str:
    return stack.new_key("durable")


def start_slow_worker(stack, name: str):
    proc = spawn(name, ["worker", "--pipeline", "test-slow"], stack.env,
                 stack.processes["worker"].log.parent)
    stack.processes[name] = proc
    wait_until(lambda: "ready" in proc.log.read_text(), 60, name)
    return proc


def test_job_submitted_while_broker_down_is_published_by_the_relay(stack, key):
    """An API whose broker is unreachable still accepts the job (outbox); the relay in the
    maintenance process publishes it and it completes."""
    port = free_port()
    env = dict(stack.env, OMNIJOBS_BROKER_URL="redis://127.0.0.1:1/0")
    api = spawn("api-nobroker", ["api", "--port", str(port)], env,
                stack.processes["worker"].log.parent)
    stack.processes["api-nobroker"] = api
    base = f"http://127.0.0.1:{port}"
    wait_until(lambda: httpx.get(f"{base}/healthz").status_code == 200, 60, "api-nobroker")
    assert httpx.get(f"{base}/readyz").json()["checks"]["broker"].startswith("error")
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"},
                      timeout=30) as c:
        resp = c.post("/v1/audio/speech", headers={"Prefer": "respond-async"},
                      json={"model": "tts-1", "input": "Delivered despite the outage."})
        assert resp.status_code == 202, resp.text
        job = wait_job(c, resp.json()["id"], timeout=60)
    assert job["status"] == "completed"
    assert job["outputs"][0]["duration_s"] > 1.0
    api.stop()


def test_killed_worker_job_is_reclaimed_and_completed(stack, key):
    victim = start_slow_worker(stack, "slow-a")
    with stack.client(key) as c:
        job_id = c.post("/v1/audio/speech", headers={"Prefer": "respond-async"},
                        json={"model": "test-slow", "input": "Survive a crash."}).json()["id"]
        running = wait_job(c, job_id, 30, until=lambda j: j["status"] == "running"
                           and j["progress"] > 0)
        assert running["attempts"] == 1
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait(10)
        start_slow_worker(stack, "slow-b")
        job = wait_job(c, job_id, timeout=90)
    assert job["status"] == "completed", job
    assert job["attempts"] == 2
    assert job["outputs"][0]["duration_s"] == pytest.approx(4.0, abs=0.1)


def test_cancel_running_job_stops_it(stack, key, seaweedfs):
    """The pipeline stops at its next chunk (it logs how far it got: fewer than its 8
    chunks) and nothing reaches the store."""
    worker = stack.processes.get("slow-b") or start_slow_worker(stack, "slow-b")
    with stack.client(key) as c:
        job_id = c.post("/v1/audio/speech", headers={"Prefer": "respond-async"},
                        json={"model": "test-slow", "input": "Stop me."}).json()["id"]
        wait_job(c, job_id, 60, until=lambda j: j["status"] == "running")
        cancelled = c.post(f"/v1/jobs/{job_id}/cancel").json()
        assert cancelled["status"] == "cancelled"

        def stopped() -> list[dict]:
            return [r for r in log_records(worker) if r.get("job_id") == job_id
                    and r["message"].startswith("test-slow stopped after")]

        wait_until(stopped, 30, "the pipeline to notice the cancel")
        chunks = int(stopped()[0]["message"].split()[3])
        assert chunks < 8
        job = c.get(f"/v1/jobs/{job_id}").json()
        assert job["status"] == "cancelled" and job["outputs"] == []
        assert c.get(f"/v1/jobs/{job_id}/content").status_code == 409
    listed = seaweedfs.client().list_objects_v2(Bucket=stack.env["OMNIJOBS_S3_BUCKET"])
    assert not [o["Key"] for o in listed.get("Contents", []) if job_id in o["Key"]]


def log_records(proc) -> list[dict]:
    return [json.loads(line) for line in proc.log.read_text().splitlines()
            if line.startswith("{")]


def test_cancel_queued_job(stack, key):
    """No worker serves test-slow once they are stopped: the job stays queued."""
    for name in ("slow-a", "slow-b"):
        if name in stack.processes:
            stack.processes[name].stop()
    with stack.client(key) as c:
        job_id = c.post("/v1/audio/speech", headers={"Prefer": "respond-async"},
                        json={"model": "test-slow", "input": "Never mind."}).json()["id"]
        assert c.get(f"/v1/jobs/{job_id}").json()["status"] == "queued"
        assert c.post(f"/v1/jobs/{job_id}/cancel").json()["status"] == "cancelled"
        again = c.post(f"/v1/jobs/{job_id}/cancel")
        assert again.status_code == 409 and again.json()["error"]["code"] == "job_not_cancellable"
        assert c.get(f"/v1/jobs/{job_id}").json()["completed_at"] is not None
