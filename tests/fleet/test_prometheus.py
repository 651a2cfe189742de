"""The KEDA objects' expressions, run for real: a Prometheus server scraping this stack's
maintenance process answers the Prometheus scaler's queries with the number of queued
jobs (and their oldest age); the PostgreSQL scaler's queries say the same from the
database; with a real 8-slot worker, the Audex object's target divides by its slots."""

from __future__ import annotations

import math
import shutil
import subprocess
from collections.abc import Iterator
from urllib.parse import urlparse

import httpx
import pytest
import yaml

from ..integration.helpers import EngineFiles
from ..services import ROOT, free_port, unavailable, wait_until
from .conftest import FleetStack, submit

KEDA = ROOT / "deploy" / "kubernetes" / "keda"
TEMPLATE = "audex-tts"  # the manifests' pipeline, swapped for one this stack leaves unserved
PIPELINE = "test-silent"
AUDEX = "nvidia/Nemotron-Labs-Audex-2B"


def scaler_queries(scaler: str) -> list[str]:
    [scaled] = [d for d in yaml.safe_load_all((KEDA / scaler / f"worker-{TEMPLATE}.yaml")
                                              .read_text()) if d["kind"] == "ScaledObject"]
    return [t["metadata"]["query"].replace(TEMPLATE, PIPELINE)
            for t in scaled["spec"]["triggers"]]


@pytest.fixture(scope="module")
def prometheus(fleet: FleetStack, tmp_path_factory) -> Iterator[str]:
    binary = shutil.which("prometheus") or unavailable("prometheus (apt-get install prometheus)")
    home = tmp_path_factory.mktemp("prometheus")
    target = urlparse(fleet.maintenance_metrics).netloc
    config = home / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "omnijobs-maintenance",
                            "static_configs": [{"targets": [target]}]}]}))
    url = f"http://127.0.0.1:{free_port()}"
    with (home / "prometheus.log").open("wb") as log:
        proc = subprocess.Popen([binary, f"--config.file={config}",
                                 f"--storage.tsdb.path={home / 'data'}",
                                 f"--web.listen-address={url.removeprefix('http://')}"],
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: httpx.get(f"{url}/-/ready", timeout=2).status_code == 200, 60,
                   "Prometheus")
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def query(url: str, expr: str) -> float | None:
    body = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert body["status"] == "success", body
    result = body["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def test_the_keda_expressions_count_the_queued_jobs(fleet: FleetStack, prometheus: str):
    jobs_expr, age_expr = scaler_queries("prometheus")
    key = fleet.new_key("prometheus")
    with fleet.client(key) as c:
        ids = [submit(c, PIPELINE) for _ in range(7)]
    queued = fleet.sql("SELECT count(*) FROM jobs WHERE pipeline = :p AND status = 'queued'",
                       p=PIPELINE)[0]
    assert queued == len(ids)  # nothing serves it: all of them wait
    wait_until(lambda: query(prometheus, jobs_expr) == queued, 60,
               "Prometheus to see the queued jobs")
    assert query(prometheus, jobs_expr) == queued
    age = query(prometheus, age_expr)
    assert age is not None and age > 0
    for sql, want in zip(scaler_queries("postgresql"), (queued, None), strict=True):
        got = fleet.sql(sql)[0]
        assert got == want if want is not None else float(got) > 0, (sql, got)
    with fleet.client(key) as c:
        for job_id in ids:
            assert c.post(f"/v1/jobs/{job_id}/cancel").status_code == 200
    wait_until(lambda: query(prometheus, jobs_expr) == 0, 60, "the gauge to fall to 0")


def test_the_keda_target_divides_the_jobs_by_a_real_workers_slots(
        fleet: FleetStack, prometheus: str, tmp_path):
    """An Audex worker with its 8 slots held (its engine still) and 8 more jobs queued:
    Prometheus answers the Audex ScaledObject's own query with 16, the slot gauges say
    8 of 8 held, and at the object's target the autoscaler's ceil(16 / target) asks for
    2 workers, not 16."""
    [scaled] = [d for d in yaml.safe_load_all(
        (KEDA / "prometheus" / "worker-audex-tts.yaml").read_text()) if d["kind"] == "ScaledObject"]
    jobs = next(t for t in scaled["spec"]["triggers"] if t["name"] == "jobs")["metadata"]
    engine = EngineFiles(tmp_path)
    worker = fleet.start_worker("keda-audex", "audex-tts", OMNIJOBS_PIPELINE_OPTIONS=(
        engine.pipeline_options(fleet.env["OMNIJOBS_PIPELINE_OPTIONS"])))
    engine.hold.touch()  # after its start: a worker speaks once through its engine first
    key = fleet.new_key("keda-slots")
    try:
        with fleet.client(key) as c:
            ids = [submit(c, AUDEX, f"Slot job number {i}.") for i in range(16)]
            wait_until(lambda: len(engine.running(ids)) == 8, 60, "8 jobs in the engine")
            wait_until(lambda: query(prometheus, jobs["query"]) == 16, 60,
                       "Prometheus to see 8 running and 8 queued")
            busy = 'sum(omnijobs_slots_busy{pipeline="audex-tts"})'
            wait_until(lambda: query(prometheus, busy) == 8, 60, "the registry's 8 held")
            assert query(prometheus, 'sum(omnijobs_worker_slots{pipeline="audex-tts"})') == 8
            assert math.ceil(query(prometheus, jobs["query"]) / int(jobs["threshold"])) == 2
            for job_id in ids:
                assert c.post(f"/v1/jobs/{job_id}/cancel").status_code == 200
    finally:
        engine.hold.unlink(missing_ok=True)
        worker.stop()
        del fleet.processes["keda-audex"]
