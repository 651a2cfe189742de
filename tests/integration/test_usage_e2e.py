"""Usage with real workers: over 50 jobs, each job's ``usage`` adds up to the same
totals in ``GET /v1/usage``, in ``omnijobs usage --csv`` and in the worker's own
Prometheus counter (its timing of the same attempts); a failed job's time is reported
as failed, apart from the billed part."""

from __future__ import annotations

import csv
import io
import time
import uuid

import pytest

from ..services import free_port, spawn, wait_until
from .helpers import assert_openai_error, render_seconds_counter, wait_job

JOBS = 50


def test_usage_over_50_jobs_equals_the_records_and_the_workers_timing(stack, tmp_path):
    metrics_port = free_port()
    worker = spawn("usage-worker", ["worker", "--pipeline", "test-fast", "--metrics-port",
                                    str(metrics_port)], stack.env, tmp_path)
    stack.processes["usage-worker"] = worker
    tenant = "usage-" + uuid.uuid4().hex[:8]
    try:
        wait_until(lambda: "ready" in worker.log.read_text(), 60, "usage worker")
        start = int(time.time()) // 3600 * 3600
        with stack.client(stack.new_key(tenant)) as c:
            ids = [c.post("/v1/audio/speech", headers={"Prefer": "respond-async"},
                          json={"model": "test-fast", "input": f"Line number {i}."}
                          ).json()["id"] for i in range(JOBS)]
            bad = c.post("/v1/audio/speech", headers={"Prefer": "respond-async"},
                         json={"model": "test-silent", "input": "Silence."}).json()["id"]
            jobs = [wait_job(c, job_id, 120) for job_id in ids]
            failed = wait_job(c, bad, 60)
            assert {j["status"] for j in jobs} == {"completed"}
            usages = [j["usage"] for j in jobs]
            per_job = sum(u["render_seconds"] for u in usages)
            assert all(u["render_seconds"] > 0 and u["failed_render_seconds"] == 0
                       and u["attempts"] == 1 and u["device"] == "cpu" and u["bytes"] > 0
                       and u["audio_seconds"] > 0 for u in usages)
            assert failed["status"] == "failed"
            assert failed["usage"]["failed_render_seconds"] == failed["usage"]["render_seconds"] > 0
            page = c.get("/v1/usage", params={"start_time": start, "bucket_width": "1h",
                                              "group_by": "pipeline"}).json()
            assert page["object"] == "page" and page["has_more"] is False
            results = [r for b in page["data"] for r in b["results"]]
            fast = [r for r in results if r["pipeline"] == "test-fast"]
            silent = [r for r in results if r["pipeline"] == "test-silent"]
            assert sum(r["num_jobs"] for r in fast) == JOBS
            assert sum(r["render_seconds"] for r in fast) == pytest.approx(per_job, abs=1e-6)
            assert sum(r["characters"] for r in fast) == sum(u["characters"] for u in usages)
            assert sum(r["bytes"] for r in fast) == sum(u["bytes"] for u in usages)
            assert sum(r["failed_render_seconds"] for r in silent) == pytest.approx(
                failed["usage"]["render_seconds"], abs=1e-9)
            refused = c.get("/v1/usage", params={"start_time": start, "group_by": "tenant"})
            assert assert_openai_error(refused, 400)["param"] == "group_by"
        workers_own = render_seconds_counter(f"http://127.0.0.1:{metrics_port}/metrics",
                                             "test-fast")
        assert workers_own == pytest.approx(per_job, abs=1e-6)
        print(f"usage_jobs={JOBS} render_seconds_records={per_job:.6f} "
              f"render_seconds_counter={workers_own:.6f}")
        rows = list(csv.DictReader(io.StringIO(stack.cli(
            "usage", "--tenant", tenant, "--since", "1d", "--bucket", "1h", "--csv",
            "--group-by", "pipeline"))))
        cli_fast = [r for r in rows if r["pipeline"] == "test-fast"]
        assert sum(int(r["jobs"]) for r in cli_fast) == JOBS
        assert sum(float(r["render_seconds"]) for r in cli_fast) == pytest.approx(
            per_job, abs=1e-3 * len(cli_fast))  # the CSV rounds to milliseconds
    finally:
        worker.stop()
