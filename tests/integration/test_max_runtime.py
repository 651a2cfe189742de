"""A pipeline call that hangs (and never looks at cancellation) cannot hold its job or
its worker: past the maximum runtime the job is retried with reason ``timeout`` and the
worker process is recycled by its supervisor."""

from __future__ import annotations

import json

from ..services import spawn, wait_until
from .helpers import wait_job

MAX_RUNTIME_S = 2


def test_a_hung_job_times_out_and_the_worker_is_recycled(stack, tmp_path):
    options = json.loads(stack.env["OMNIJOBS_PIPELINE_OPTIONS"])
    options["test-stuck"] = {"max_runtime_s": MAX_RUNTIME_S,
                             "stuck_attempts_file": str(tmp_path / "attempts")}
    env = dict(stack.env, OMNIJOBS_PIPELINE_OPTIONS=json.dumps(options))
    worker = spawn("stuck-worker", ["worker", "--pipeline", "test-stuck"], env, tmp_path)
    stack.processes["stuck-worker"] = worker
    try:
        wait_until(lambda: "ready" in worker.log.read_text(), 60, "stuck worker")
        with stack.client(stack.new_key("stuck")) as c:
            job_id = c.post("/v1/audio/speech", headers={"Prefer": "respond-async"},
                            json={"model": "test-stuck", "input": "Hang on."}).json()["id"]
            # The first attempt hangs for 600 s; the second one (a fresh process) doesn't.
            job = wait_job(c, job_id, 180)  # a recycle under a loaded machine
        assert job["status"] == "completed", job
        assert job["attempts"] == 2
        records = [json.loads(line) for line in worker.log.read_text().splitlines()
                   if line.startswith("{")]
        mine = [r["message"] for r in records if r.get("job_id") == job_id]
        assert any("timeout: the job ran past" in m for m in mine), mine
        assert any("recycling the worker process" in r["message"] for r in records)
        assert worker.log.read_text().count(" ready.") == 2  # a second, fresh child
        assert worker.proc.poll() is None  # the supervisor itself lives on
    finally:
        worker.stop()
