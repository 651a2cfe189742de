"""The services a benchmark run starts for itself, and takes down again.

A fresh PostgreSQL database on the machine's server (dropped afterwards), a private
``redis-server`` on a free port, SeaweedFS, the omnijobs API and worker of a source tree
(this one, or another commit checked out for a before/after run) and the bare baseline
endpoint. Everything is registered on an ``ExitStack``, so an error or Ctrl-C cleans up.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.services import (
    ROOT,
    Process,
    create_database,
    drop_database,
    free_port,
    start_seaweedfs,
    wait_until,
)

BENCH_PIPELINES = '["piper-joe", "bench-clip"]'
SHIM_MODULE = "fastpaths_bench_pipelines"  # bench/pipelines.py, importable by any tree


class Unsupported(Exception):
    """The tree's CLI refused an option it does not have (an older build)."""


@dataclass
class Tree:
    """A source tree whose ``omnijobs`` is run: this checkout or another commit."""

    label: str
    path: Path
    pipeline_module: str = "bench.pipelines"
    extra_path: Path | None = None  # where the copied bench pipelines live, for other trees

    def pythonpath(self) -> str:
        parts = [self.path, *([self.extra_path] if self.extra_path else [])]
        return os.pathsep.join(str(p) for p in parts)


def git_commit(path: Path) -> str:
    """The short commit id, with ``+changes`` when tracked files differ from it."""
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=path,
                         capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=path,
                           capture_output=True, text=True).stdout.strip()
    return (out.stdout.strip() or "unknown") + ("+changes" if dirty else "")


@contextmanager
def checkout(ref: str, workdir: Path) -> Iterator[Tree]:
    """``ref`` checked out (detached) into a temporary ``git worktree``, removed after.

    The bench pipelines come from this tree, copied under a module name of their own, so
    a commit that predates them can still serve the worker-overhead figure."""
    path = workdir / "ref"
    subprocess.run(["git", "worktree", "add", "--detach", "--quiet", str(path), ref],
                   cwd=ROOT, check=True)
    try:
        shim = workdir / "shim"
        shim.mkdir()
        shutil.copy(ROOT / "bench" / "pipelines.py", shim / f"{SHIM_MODULE}.py")
        yield Tree(label=f"{ref} ({git_commit(path)})", path=path,
                   pipeline_module=SHIM_MODULE, extra_path=shim)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=ROOT,
                       capture_output=True)


@dataclass
class Redis:
    url: str
    proc: subprocess.Popen

    def db(self, index: int) -> str:
        return f"{self.url}/{index}"


def start_redis(stack: ExitStack, logdir: Path) -> Redis:
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("redis-server is not installed")
    port = free_port()
    with (logdir / "redis.log").open("wb") as log:
        proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1",
                                 "--save", "", "--appendonly", "no"],
                                stdout=log, stderr=subprocess.STDOUT)
    stack.callback(_stop, proc)
    url = f"redis://127.0.0.1:{port}"

    def ready() -> bool:
        import redis

        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())

    wait_until(ready, 20, "redis-server")
    return Redis(url, proc)


def _stop(proc: subprocess.Popen, timeout: float = 20) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def database(stack: ExitStack) -> str:
    """A fresh, empty database; migrated by the tree that uses it."""
    url = create_database()
    stack.callback(drop_database, url)
    return url


def seaweedfs(stack: ExitStack, workdir: Path):
    sw = start_seaweedfs(workdir / "seaweedfs")
    stack.callback(sw.stop)
    return sw


BENCH_LIMITS = {"OMNIJOBS_TENANT_SUBMITS_PER_S": "0", "OMNIJOBS_TENANT_MAX_ACTIVE": "10000000",
                "OMNIJOBS_PIPELINE_MAX_QUEUED": "10000000"}


def omnijobs_env(tree: Tree, pg: str, redis: str, sw, home: Path) -> dict[str, str]:
    """Production mode: PostgreSQL, Redis, S3; Piper and the fixed-clip bench pipeline."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNIJOBS_")}
    env.update({
        "PYTHONPATH": tree.pythonpath(), "OMNIJOBS_MODE": "production",
        "OMNIJOBS_HOME": str(home), "OMNIJOBS_DATABASE_URL": pg, "OMNIJOBS_BROKER_URL": redis,
        "OMNIJOBS_OBJECT_STORE": "s3", "OMNIJOBS_S3_ENDPOINT_URL": sw.endpoint,
        "OMNIJOBS_S3_BUCKET": "omnijobs-bench", "OMNIJOBS_S3_ACCESS_KEY_ID": sw.access_key,
        "OMNIJOBS_S3_SECRET_ACCESS_KEY": sw.secret_key,
        "OMNIJOBS_SIGNING_SECRET": "benchmark-signing-secret-0123",
        "OMNIJOBS_PIPELINES": BENCH_PIPELINES,
        "OMNIJOBS_PIPELINE_MODULES": json.dumps([tree.pipeline_module]),
        # The load measures the path, not the limits: no per-tenant rate limit (50/s by
        # default in production), and quotas no run reaches (no worker drains the queue).
        **BENCH_LIMITS,
    })
    return env


def cli(tree: Tree, env: dict[str, str], *args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "omnijobs.cli", *args], env=env, cwd=tree.path,
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"omnijobs {' '.join(args)} failed:\n{out.stderr[-2000:]}")
    return out.stdout


def prepare(tree: Tree, env: dict[str, str]) -> str:
    """Migrate the tree's database with its own migrations; returns a new API key."""
    cli(tree, env, "migrate")
    return cli(tree, env, "keys", "create", "--tenant", "bench").strip().splitlines()[-1]


def spawn(name: str, argv: list[str], env: dict[str, str], cwd: Path, logdir: Path,
          stack: ExitStack | None = None) -> Process:
    log = logdir / f"{name}.log"
    with log.open("wb") as out:  # the child keeps its own descriptor
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
    process = Process(name, proc, log)
    if stack is not None:
        stack.callback(process.stop)
    return process


class ProcessExited(Exception):
    def __init__(self, process: Process) -> None:
        super().__init__(f"{process.name} exited with {process.proc.returncode}:\n"
                         f"{process.tail()}")
        self.process = process


def wait_ready(process: Process, check, timeout: float) -> None:
    """Poll ``check`` until it is true; a process that exits first raises ProcessExited."""
    deadline = time.monotonic() + timeout
    while True:
        if process.proc.poll() is not None:
            raise ProcessExited(process)
        try:
            if check():
                return
        except Exception:  # not up yet
            pass
        if time.monotonic() > deadline:
            process.stop()
            raise RuntimeError(f"{process.name} did not start in {timeout}s:\n{process.tail()}")
        time.sleep(0.2)


def http_ok(url: str):
    return lambda: httpx.get(url, timeout=2).status_code == 200


def start_api(tree: Tree, env: dict[str, str], logdir: Path, workers: int | None = None,
              name: str = "api") -> tuple[Process, str]:
    """``omnijobs api`` on a free port; ``--workers`` is passed only when asked for."""
    port = free_port()
    argv = [sys.executable, "-m", "omnijobs.cli", "api", "--port", str(port)]
    if workers is not None:
        argv += ["--workers", str(workers)]
    process = spawn(name, argv, env, tree.path, logdir)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(process, http_ok(f"{base}/readyz"), 240)  # a loaded 2-core machine
    except ProcessExited as exc:
        if workers is not None and exc.process.proc.returncode == 2 and \
                "--workers" in exc.process.tail():
            raise Unsupported("omnijobs api --workers: not supported by this build") from exc
        raise RuntimeError(str(exc)) from exc
    return process, base


def start_worker(tree: Tree, env: dict[str, str], logdir: Path) -> Process:
    argv = [sys.executable, "-m", "omnijobs.cli", "worker", "--pipeline", "piper-joe",
            "--pipeline", "bench-clip"]
    process = spawn("worker", argv, env, tree.path, logdir)
    try:
        wait_ready(process, lambda: "ready" in process.log.read_text(errors="replace"), 180)
    except ProcessExited as exc:
        raise RuntimeError(str(exc)) from exc
    return process


def start_maintenance(tree: Tree, env: dict[str, str], logdir: Path) -> Process:
    """``omnijobs maintenance`` (the outbox relay and the batch step)."""
    process = spawn("maintenance", [sys.executable, "-m", "omnijobs.cli", "maintenance"], env,
                    tree.path, logdir)
    try:
        wait_ready(process, lambda: "ready" in process.log.read_text(errors="replace"), 120)
    except ProcessExited as exc:
        raise RuntimeError(str(exc)) from exc
    return process


def start_bare(pg: str, redis: str, logdir: Path, stack: ExitStack) -> tuple[Process, str]:
    """The bare baseline (bench/bare_api.py) in its own uvicorn process."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "bench.bare_api", "--port", str(port), "--database-url", pg,
            "--redis-url", redis]
    process = spawn("bare", argv, env, ROOT, logdir, stack)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(process, http_ok(f"{base}/healthz"), 240)
    except ProcessExited as exc:
        raise RuntimeError(str(exc)) from exc
    return process, base


def workdir(stack: ExitStack) -> Path:
    path = Path(tempfile.mkdtemp(prefix="omnijobs-fastpaths-"))
    stack.callback(shutil.rmtree, path, ignore_errors=True)
    return path
