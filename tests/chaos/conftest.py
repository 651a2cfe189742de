"""A deployment of its own for the chaos tests: its own Redis server, SeaweedFS and
database (so stopping them harms nobody else), with an API, the maintenance process and
a render worker serving the fast fake pipeline. Each test breaks something real, then
counts what became of every job it submitted and prints one line:
``submitted=N completed=N failed=N duplicated=N lost=N`` (the stalls add ``max_answer_s``,
the longest any request waited for its answer during the stall)."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import pytest

from ..conftest import migrated_database, stack_env
from ..services import (
    Process,
    RedisServer,
    Stack,
    free_port,
    spawn,
    start_seaweedfs,
    wait_until,
)

LIMIT_S = 240  # a hard bound on each chaos test
COUNTS: list[str] = []


# The pipelines every render worker of the chaos stack serves unless told otherwise.
# test-instant renders at once: the broker tests use it for jobs that can only run once
# the broker is back, where render time would be nothing but waiting.
WORKER_PIPELINES = ("test-fast", "test-sleep", "test-instant")


@dataclass
class Chaos(Stack):
    home: Path = Path()
    redis: RedisServer | None = None
    seaweedfs: object = None
    db_url: str = ""

    def start_worker(self, name: str, pipelines: tuple[str, ...] = WORKER_PIPELINES,
                     env: dict[str, str] | None = None, **extra: str) -> Process:
        [proc] = self.start_workers((name, pipelines, env, extra))
        return proc

    def start_workers(self, *specs: tuple[str, tuple[str, ...], dict[str, str] | None,
                                          dict[str, str]]) -> list[Process]:
        """Start several workers at once (name, pipelines, env, extra env each) and wait
        until every one is ready: they start side by side, not one after another."""
        procs = []
        for name, pipelines, env, extra in specs:
            proc = spawn(name, ["worker", *(a for p in pipelines for a in ("--pipeline", p))],
                         {**(env or self.env), **extra}, self.home)
            self.processes[name] = proc
            procs.append(proc)
        for proc in procs:
            wait_until(lambda p=proc: " ready." in p.log.read_text(), 90, proc.name)
        return procs

    def default_workers(self) -> list[str]:
        """The running workers of the fixture's own kind: worker-1, or the worker-2 that
        replaced it once test_workers killed it."""
        return [n for n in ("worker-1", "worker-2")
                if n in self.processes and self.processes[n].proc.poll() is None]

    def worker_records(self) -> list[dict]:
        records = []
        for path in self.home.glob("worker*.log"):
            records += [json.loads(line) for line in path.read_text().splitlines()
                        if line.startswith("{")]
        return records


def until(check, timeout: float) -> bool:
    """Poll ``check`` until it holds (True) or ``timeout`` passes (False): for an outage
    that ends once what it is meant to cause has happened, the test's own assertions then
    saying what did not."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


ASYNC = {"Prefer": "respond-async"}


class Load:
    """Submits ``n`` jobs of ``model``, one every ``every_s``, on a thread; keeps each
    answer's status and when it was sent and answered (``times``: monotonic start and
    end). The first ``slow`` jobs take ``slow_s`` of work each, to leave a backlog in the
    queue."""

    def __init__(self, client: httpx.Client, n: int, every_s: float, slow: int = 0,
                 model: str = "test-fast", slow_s: float = 1.0):
        self.client, self.n, self.every_s, self.slow = client, n, every_s, slow
        self.model, self.slow_s = model, slow_s
        self.statuses: list[int] = []
        self.accepted: list[str] = []
        self.times: list[tuple[float, float]] = []
        self.retry_after: list[str | None] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        for i in range(self.n):
            body = ({"model": "test-sleep", "input": f"{self.slow_s:g}"} if i < self.slow
                    else {"model": self.model, "input": f"Load {i}."})
            sent = time.monotonic()
            try:
                resp = self.client.post("/v1/audio/speech", headers=ASYNC, json=body)
            except httpx.HTTPError:
                self.statuses.append(0)
                continue
            finally:
                self.times.append((sent, time.monotonic()))
            self.statuses.append(resp.status_code)
            self.retry_after.append(resp.headers.get("retry-after"))
            if resp.status_code == 202:
                self.accepted.append(resp.json()["id"])
            time.sleep(self.every_s if i >= self.slow else 0)

    def longest_answer_s(self, start: float, end: float) -> float:
        """The longest time a request sent between ``start`` and ``end`` waited."""
        return max((done - sent for sent, done in self.times if start <= sent <= end),
                   default=0.0)

    def __enter__(self) -> Load:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.thread.join(120)


@pytest.fixture(scope="package")
def chaos(tmp_path_factory) -> Iterator[Chaos]:
    home = tmp_path_factory.mktemp("chaos")
    redis = RedisServer(home).start()
    sw = start_seaweedfs(home / "seaweedfs")
    db = migrated_database()
    db_url = next(db)
    # A restarted weed (``resume``) finds its master's raft state and waits out an
    # election timeout (10 s by default) before it serves; one master elects itself.
    sw.cmd.append("-master.electionTimeout=1s")
    env = stack_env(db_url, redis.url, sw, home, **{
        "OMNIJOBS_S3_BUCKET": "chaos",
        "OMNIJOBS_LEASE_S": "3",
        "OMNIJOBS_STALE_QUEUED_S": "3",
        "OMNIJOBS_RETRY_BACKOFF_S": "0.5",
        "OMNIJOBS_STORAGE_RETRY_S": "90",
        "OMNIJOBS_MAINTENANCE_PERIODS": json.dumps(
            {"relay": 0.5, "reap": 0.5, "sweep_queued": 1}),
    })
    env["OMNIJOBS_PIPELINES"] = json.dumps(
        [*json.loads(env["OMNIJOBS_PIPELINES"]), "test-instant"])
    port = free_port()
    st = Chaos(base_url=f"http://127.0.0.1:{port}", env=env, home=home, redis=redis,
               seaweedfs=sw, db_url=db_url)
    st.processes["api"] = spawn("api", ["api", "--port", str(port)], env, home)
    st.processes["maintenance"] = spawn("maintenance", ["maintenance"], env, home)
    try:
        st.start_worker("worker-1")
        wait_until(lambda: httpx.get(f"{st.base_url}/readyz", timeout=5).status_code == 200,
                   60, "chaos API")
        yield st
    finally:
        st.stop()
        sw.stop()  # killed: its folder goes next
        redis.stop()
        next(db, None)


@pytest.fixture(autouse=True)
def bounded():
    """Each chaos test ends within LIMIT_S, whatever it waits on."""
    def expire(_signum, _frame):
        raise TimeoutError(f"chaos test ran past {LIMIT_S}s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(LIMIT_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@dataclass
class Counts:
    submitted: int = 0
    completed: int = 0
    failed: int = 0
    duplicated: int = 0
    lost: int = 0
    superseded: int = 0  # objects of an earlier attempt, left for the orphan sweep

    def line(self, **extra: object) -> str:
        return " ".join(f"{k}={v}" for k, v in {**asdict(self), **extra}.items())


def settle(client: httpx.Client, ids: list[str], timeout: float) -> dict[str, dict]:
    """Wait until every job is finished (or the time is up); their final states."""
    deadline = time.monotonic() + timeout
    jobs: dict[str, dict] = {}
    while time.monotonic() < deadline:
        for job_id in ids:
            if jobs.get(job_id, {}).get("status") not in ("completed", "failed", "cancelled"):
                resp = client.get(f"/v1/jobs/{job_id}")
                if resp.status_code == 200:
                    jobs[job_id] = resp.json()
        if all(jobs.get(i, {}).get("status") in ("completed", "failed", "cancelled")
               for i in ids):
            break
        time.sleep(0.3)
    return jobs


def tally(chaos: Chaos, ids: list[str], jobs: dict[str, dict], name: str,
          **extra: object) -> Counts:
    """Count outcomes: a job completed more than once (two completion records in the
    workers' logs) or with more objects of its recorded attempt than outputs is
    duplicated; a job neither completed nor failed is lost. Objects of an earlier attempt
    (one whose completion could not be confirmed, say) are counted apart: the orphan
    sweep deletes them, and no record names them; one of a later attempt than the
    record's is a duplicate. Every recorded object must match its sha256."""
    import hashlib

    s3 = chaos.seaweedfs.client()
    bucket = chaos.env["OMNIJOBS_S3_BUCKET"]
    stored: dict[str, list[str]] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", []):
            stored.setdefault(obj["Key"].split("/")[1], []).append(obj["Key"])
    completions: dict[str, int] = {}
    for record in chaos.worker_records():
        job_id = record.get("job_id")
        if job_id and record["message"] == f"job {job_id} completed":
            completions[job_id] = completions.get(job_id, 0) + 1
    counts = Counts(submitted=len(ids))
    for job_id in ids:
        job = jobs.get(job_id, {})
        status, outputs = job.get("status"), job.get("outputs", [])
        counts.completed += status == "completed"
        counts.failed += status == "failed"
        counts.lost += status not in ("completed", "failed")
        attempt = job.get("attempts", 0)
        by_attempt: dict[int, list[str]] = {}
        for key in stored.get(job_id, []):
            by_attempt.setdefault(int(key.split("/")[2].removeprefix("a")), []).append(key)
        keys = by_attempt.pop(attempt, [])
        counts.superseded += sum(len(v) for a, v in by_attempt.items() if a < attempt)
        counts.duplicated += (completions.get(job_id, 0) > 1 or len(keys) > len(outputs)
                              or any(a > attempt for a in by_attempt))
        for out in outputs if status == "completed" else []:
            [key] = [k for k in keys if k.rsplit("/", 1)[1].startswith(f"{out['index']}.")]
            data = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
            assert hashlib.sha256(data).hexdigest() == out["sha256"], (job_id, key)
    line = counts.line(**extra)
    print(f"{name}: {line}")
    COUNTS.append(f"{name}: {line}")
    return counts


def pytest_terminal_summary(terminalreporter) -> None:
    if COUNTS:
        terminalreporter.section("chaos counts")
        for line in COUNTS:
            terminalreporter.write_line(line)
