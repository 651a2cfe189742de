"""``omnijobs api --workers 2``: every scrape answers for both processes together, so no
counter ever goes down between scrapes and the request counts add up to what was sent."""

from __future__ import annotations

import http.client
import json
import threading

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ..services import free_port, spawn, wait_until
from .conftest import light_env, submit

HEALTHZ = ("omnijobs_http_request_duration_seconds_count",
           (("method", "GET"), ("route", "/healthz"), ("status", "200")))


def counters(url: str) -> dict[tuple[str, tuple], float]:
    """The samples of every counter and histogram on the page."""
    text = httpx.get(url, timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            if family.type in ("counter", "histogram")
            for s in family.samples if not s.name.endswith("_created")}


def traffic(base_url: str, n: int, done: list[int]) -> None:
    """``n`` requests, each on a new connection, so the kernel spreads them over the
    processes sharing the port. (The standard library's client: an httpx client per
    request builds an SSL context each time, 10 s of CPU for the test's 240.)"""
    url = httpx.URL(base_url)
    ok = 0
    for _ in range(n):
        conn = http.client.HTTPConnection(url.host, url.port, timeout=10)
        try:
            conn.request("GET", "/healthz")
            ok += conn.getresponse().status == 200
        finally:
            conn.close()
    done.append(ok)


@pytest.mark.parametrize("where", ["public route", "metrics port"])
def test_two_api_processes_give_one_set_of_counters(where, fleet_db, fleet_redis, tmp_path):
    port, metrics_port = free_port(), free_port()
    public = where == "public route"
    env = light_env(fleet_db, fleet_redis, tmp_path,
                    OMNIJOBS_METRICS_PUBLIC="true" if public else "false")
    args = ["api", "--port", str(port), "--workers", "2"]
    if not public:
        args += ["--metrics-port", str(metrics_port)]
    api = spawn("api-workers", args, env, tmp_path)
    base = f"http://127.0.0.1:{port}"
    url = f"{base}/metrics" if public else f"http://127.0.0.1:{metrics_port}/metrics"
    try:
        wait_until(lambda: httpx.get(f"{base}/readyz", timeout=2).status_code == 200, 60,
                   f"two-process API:\n{api.tail()}" if api.proc.poll() is not None else "API")
        done: list[int] = []
        senders = [threading.Thread(target=traffic, args=(base, 60, done)) for _ in range(4)]
        for t in senders:
            t.start()
        seen: dict[tuple[str, tuple], float] = {}
        went_down = []
        scrapes = 0
        while any(t.is_alive() for t in senders) or scrapes < 6:
            for key, value in counters(url).items():
                if value < seen.get(key, 0.0):
                    went_down.append((key, seen[key], value))
                seen[key] = value
            scrapes += 1
        for t in senders:
            t.join()
        assert not went_down, f"counters went down between scrapes: {went_down[:5]}"
        assert sum(done) == 240
        assert counters(url)[HEALTHZ] == 240, "the request counts do not add up"
    finally:
        api.stop()


def test_a_workers_metrics_survive_its_restart(fleet, tmp_path):
    """The supervisor serves the worker's metrics: counts of a child that was recycled
    (a job past its maximum runtime) stay in the sum beside the fresh child's."""
    options = json.loads(fleet.env["OMNIJOBS_PIPELINE_OPTIONS"])
    options["test-stuck"] = {"max_runtime_s": 2,
                             "stuck_attempts_file": str(tmp_path / "attempts")}
    port = free_port()
    worker = spawn("metrics-worker", ["worker", "--pipeline", "test-stuck", "--metrics-port",
                                      str(port)],
                   {**fleet.env, "OMNIJOBS_PIPELINE_OPTIONS": json.dumps(options)}, tmp_path)
    url = f"http://127.0.0.1:{port}/metrics"
    finished = "omnijobs_jobs_finished_total"
    job_id = None
    with fleet.client(fleet.new_key("worker-metrics")) as c:
        try:
            wait_until(lambda: " ready." in worker.log.read_text(), 90, "the worker")
            job_id = submit(c, "test-stuck")  # hangs once: the first child is recycled
            # a fresh child's start and the retry's backoff: long on a loaded machine
            wait_until(lambda: c.get(f"/v1/jobs/{job_id}").json()["status"] == "completed",
                       180, "the job to complete on a fresh child")
            assert worker.log.read_text().count(" ready.") == 2
            page = counters(url)
            assert page[(finished, (("outcome", "timeout-retrying"),
                                    ("pipeline", "test-stuck")))] == 1  # the recycled child's
            assert page[(finished, (("outcome", "completed"), ("pipeline", "test-stuck")))] == 1
        finally:
            worker.stop()
            if job_id is not None:  # never left queued for the package's later tests
                c.post(f"/v1/jobs/{job_id}/cancel")
