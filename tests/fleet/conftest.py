"""Helpers for the fleet tests: processes over a database and Redis of their own."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

from storage.db import make_engine

from ..conftest import migrated_database, stack_env
from ..services import ROOT, Process, Stack, free_port, redis_db, redis_url, spawn, wait_until


def light_env(db_url: str, broker: str, home: Path, **extra: str) -> dict[str, str]:
    """Production mode over PostgreSQL and Redis with the local object store: what an
    API process needs to serve, without an S3 server."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNIJOBS_")}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    env.update({"PYTHONPATH": str(ROOT), "OMNIJOBS_MODE": "production",
                "OMNIJOBS_HOME": str(home), "OMNIJOBS_DATABASE_URL": db_url,
                "OMNIJOBS_BROKER_URL": broker, "OMNIJOBS_OBJECT_STORE": "local",
                "OMNIJOBS_SIGNING_SECRET": "fleet-tests-signing-secret"})
    env.update(extra)
    return env


@pytest.fixture
def fleet_db() -> Iterator[str]:
    yield from migrated_database()


@pytest.fixture
def fleet_redis() -> Iterator[str]:
    with redis_db() as url:
        yield url


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """Every sample of a Prometheus text page, keyed by name and sorted labels."""
    text = httpx.get(url, timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def sample(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


@dataclass
class FleetStack(Stack):
    """An API, the maintenance process (metrics port: the fleet's gauges) and whatever
    workers a test starts, over a database, Redis database and bucket of their own."""

    home: Path = Path()
    db_url: str = ""
    maintenance_metrics: str = ""

    def start_worker(self, name: str, *pipelines: str, **env: str) -> Process:
        args = ["worker", *(a for p in pipelines for a in ("--pipeline", p))]
        proc = spawn(name, args, {**self.env, **env}, self.home)
        self.processes[name] = proc
        wait_until(lambda: proc.proc.poll() is None and " ready." in proc.log.read_text(),
                   90, f"{name}:\n{proc.tail()}" if proc.proc.poll() is not None else name)
        return proc

    def records(self, name: str) -> list[dict]:
        return [json.loads(line) for line in self.processes[name].log.read_text().splitlines()
                if line.startswith("{")]

    def sql(self, statement: str, **params):
        """One row (or None), read straight from the database."""
        engine = make_engine(self.db_url)
        try:
            with engine.connect() as conn:
                return conn.execute(text(statement), params).first()
        finally:
            engine.dispose()


@pytest.fixture(scope="package")
def fleet(seaweedfs, tmp_path_factory) -> Iterator[FleetStack]:
    home = tmp_path_factory.mktemp("fleet")
    db = migrated_database()
    db_url = next(db)
    env = stack_env(db_url, redis_url(), seaweedfs, home, **{
        "OMNIJOBS_WORKER_HEARTBEAT_S": "1",  # a killed worker drops out within 3 s
        "OMNIJOBS_FLEET_METRICS_CACHE_S": "0",  # each scrape reads the database
        "OMNIJOBS_LEASE_S": "60",  # far beyond a drain's hand-back, so one is told apart
        "OMNIJOBS_MAINTENANCE_PERIODS": json.dumps({"relay": 0.5, "reap": 0.5}),
    })
    port, metrics_port = free_port(), free_port()
    st = FleetStack(base_url=f"http://127.0.0.1:{port}", env=env, home=home, db_url=db_url,
                    maintenance_metrics=f"http://127.0.0.1:{metrics_port}/metrics")
    st.processes["api"] = spawn("api", ["api", "--port", str(port)], env, home)
    st.processes["maintenance"] = spawn(
        "maintenance", ["maintenance", "--metrics-port", str(metrics_port)], env, home)
    try:
        wait_until(lambda: httpx.get(f"{st.base_url}/readyz", timeout=2).status_code == 200,
                   60, "fleet API")
        wait_until(lambda: httpx.get(st.maintenance_metrics, timeout=2).status_code == 200,
                   60, "maintenance metrics")
        yield st
    finally:
        st.stop()
        next(db, None)


ASYNC = {"Prefer": "respond-async"}


def submit(client: httpx.Client, model: str, text: str = "1") -> str:
    """One accepted job. A submit over the tenant's rate limit (a fast machine sends more
    than 50 a second) waits out the 429's Retry-After and is sent again, as a client
    should: the rate limit stays on, and no test depends on how fast the machine is."""
    deadline = time.monotonic() + 60
    while True:
        resp = client.post("/v1/audio/speech", headers=ASYNC,
                           json={"model": model, "input": text})
        if resp.status_code != 429 or time.monotonic() > deadline:
            break
        assert resp.json()["error"]["code"] == "rate_limit_exceeded", resp.text
        time.sleep(float(resp.headers["retry-after"]))
    assert resp.status_code == 202, resp.text
    return resp.json()["id"]
