"""The fair-share tests' own deployment: an API and the maintenance process over a
database, Redis database and bucket of their own; each test starts the workers it
counts on, after its queue is in place, and leaves no queued job behind."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine, text

from storage.db import make_engine

from ..conftest import migrated_database
from ..fleet.conftest import light_env
from ..services import Process, Stack, free_port, redis_url, spawn, stop_all, wait_until

INSTANT, PACED = "test-instant", "test-paced"


@dataclass
class FairStack(Stack):
    home: Path = Path()
    db_url: str = ""
    _engine: Engine | None = None

    @property
    def engine(self) -> Engine:
        """One pool for every read and write the tests make here: a poll every 0.2 s
        does not open a connection (a server process) each time."""
        if self._engine is None:
            self._engine = make_engine(self.db_url)
        return self._engine

    def start_worker(self, name: str, pipeline: str) -> Process:
        return self.start_workers(pipeline, name)[0]

    def start_workers(self, pipeline: str, *names: str) -> list[Process]:
        """A worker per name, all started at once (a start is mostly imports, which
        need not wait for each other), each waited for until it consumes."""
        procs = [spawn(name, ["worker", "--pipeline", pipeline], self.env, self.home)
                 for name in names]
        for proc in procs:
            self.processes[proc.name] = proc
        for proc in procs:
            wait_until(lambda p=proc: p.proc.poll() is None and " ready." in
                       p.log.read_text(), 300, proc.name)
        return procs

    def stop(self) -> None:
        stop_all(list(self.processes.values()))
        if self._engine is not None:
            self._engine.dispose()

    def rows(self, statement: str, **params) -> list:
        with self.engine.connect() as conn:
            return conn.execute(text(statement), params).all()

    def finished_since(self, pipeline: str, since: datetime) -> list[tuple[str, datetime]]:
        """(tenant, completed_at) of the pipeline's jobs completed since ``since``, in
        completion order."""
        return [tuple(r) for r in self.rows(
            "SELECT tenant_id, completed_at FROM jobs WHERE pipeline = :p AND "
            "status = 'completed' AND completed_at >= :t ORDER BY completed_at, id",
            p=pipeline, t=since)]

    def clear(self) -> None:
        """What a test left queued is cancelled, so the next test's queue is its own."""
        with self.engine.begin() as conn:
            conn.execute(text("UPDATE jobs SET status = 'cancelled' WHERE status = 'queued'"))


@pytest.fixture(scope="package")
def stack(tmp_path_factory) -> Iterator[FairStack]:
    """The local object store (as the fleet tests' light stacks): what is measured here
    is the order of the claims, not the uploads."""
    home = tmp_path_factory.mktemp("fair-stack")
    db = migrated_database()
    db_url = next(db)
    env = light_env(db_url, redis_url(), home,
                    OMNIJOBS_PIPELINES=json.dumps([INSTANT, PACED]),
                    OMNIJOBS_PIPELINE_MODULES='["tests.fake_pipelines"]',
                    OMNIJOBS_OUTBOX_GRACE_S="1",
                    OMNIJOBS_MAINTENANCE_PERIODS=json.dumps({"relay": 0.5, "reap": 0.5}),
                    OMNIJOBS_TENANT_MAX_ACTIVE="5000", OMNIJOBS_TENANT_SUBMITS_PER_S="0",
                    OMNIJOBS_WORKER_HEARTBEAT_S="1", OMNIJOBS_LEASE_S="30")
    port = free_port()
    st = FairStack(base_url=f"http://127.0.0.1:{port}", env=env, home=home, db_url=db_url)
    try:
        st.processes["api"] = spawn("api", ["api", "--port", str(port)], env, home)
        st.processes["maintenance"] = spawn("maintenance", ["maintenance"], env, home)
        try:
            wait_until(lambda: httpx.get(f"{st.base_url}/readyz", timeout=2).status_code
                       == 200, 300, "API")
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n{st.processes['api'].tail()}") from None
        wait_until(lambda: "ready" in st.processes["maintenance"].log.read_text(), 300,
                   "maintenance")
        yield st
    finally:
        st.stop()
        next(db, None)


@pytest.fixture
def fair(stack) -> Iterator[FairStack]:
    yield stack
    stop_all([stack.processes.pop(name) for name in list(stack.processes)
                   if name not in ("api", "maintenance")])
    stack.clear()


def submit_many(st: Stack, key: str, model: str, n: int, label: str = "x") -> list[str]:
    """n jobs for the key's tenant, eight submits at a time; their ids in submit order."""
    def one(i: int) -> str:
        resp = client.post("/v1/audio/speech", headers={"Prefer": "respond-async"},
                           json={"model": model, "input": f"{label} {i}",
                                 "response_format": "wav"})
        assert resp.status_code == 202, resp.text
        return resp.json()["id"]

    with st.client(key) as client, ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, range(n)))


def wait_done(st: FairStack, job_ids: list[str], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        [(left,)] = st.rows("SELECT count(*) FROM jobs WHERE id = ANY(:ids) AND status "
                            "IN ('queued', 'running')", ids=job_ids)
        if left == 0:
            return
        time.sleep(0.2)
    raise AssertionError(f"{left} of {len(job_ids)} jobs still unfinished after {timeout}s")
