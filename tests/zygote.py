"""One warmed Python per test process, which forks the service processes tests start.

Each ``omnijobs api``, ``maintenance`` or ``worker`` a test starts is a fresh Python
that imports SQLAlchemy, Celery, FastAPI, boto3, pydantic and typer before it does
anything: over a second of CPU, about 160 times a run, on two cores. The zygote imports
those libraries once, then forks a child per process asked for. The child changes to
the asked-for folder, environment and log, and runs ``python -m omnijobs.cli ARGS`` as a
fresh interpreter would (``runpy``, ``__main__``). The code under test is still imported
in the child, from the same files, with the child's environment.

What a fork inherits but a fresh interpreter would read from its environment is kept
out: only third-party libraries are warmed, none that reads the environment when
imported (prometheus_client's multiprocess mode does, so it is refused here), and a
process whose interpreter settings differ (``PYTHON*`` variables) is started the plain
way (``tests/services.spawn``). A worker's supervisor still starts its render worker as a
fresh interpreter, as in production.

Protocol: one JSON request a line on the zygote's stdin, the child's pid a line back on
its stdout; the zygote reaps its children and writes each exit status (``Popen``'s
``returncode``: negative for a signal) to ``STATUS/<pid>``.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

# Imported once here, shared by every child. Nothing of the project's own: its modules
# are what the tests test, and stay the child's to import.
WARM = (
    "sqlalchemy", "sqlalchemy.orm", "sqlalchemy.dialects.postgresql",
    "sqlalchemy.dialects.sqlite", "psycopg", "alembic", "celery", "celery.app",
    "celery.worker", "kombu", "redis", "redis.asyncio", "boto3", "botocore.session",
    "fastapi", "starlette", "uvicorn", "pydantic", "pydantic_settings", "typer", "rich",
    "click", "httpx", "jinja2", "yaml", "anyio", "numpy",
)
NEVER = ("prometheus_client",)  # reads PROMETHEUS_MULTIPROC_DIR when imported


def interpreter_env(env: dict[str, str]) -> dict[str, str]:
    """The variables a Python reads as it starts, which a fork cannot change."""
    return {k: v for k, v in env.items() if k.startswith("PYTHON") and k != "PYTHONPATH"}


# ---- the zygote's side -------------------------------------------------------------------

def serve() -> None:
    """Warm up, then serve requests until stdin closes; in a forked child, become the
    asked-for process instead (this function then runs it, and the interpreter exits
    with its status)."""
    import importlib

    for name in WARM:
        importlib.import_module(name)
    leaked = [m for m in NEVER if m in sys.modules]
    assert not leaked, f"a warmed library imported {leaked}"
    status = Path(sys.argv[1])
    request = _serve(status)
    _become(request)


def _serve(status: Path) -> dict:
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    requests = sys.stdin.buffer
    while True:
        ready, _, _ = select.select([requests, wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 512)
            _reap(status)
        if requests in ready:
            line = requests.readline()
            if not line:  # the test process is done with us
                raise SystemExit(0)
            request = json.loads(line)
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                os.close(wake_r)
                os.close(wake_w)
                return request
            sys.stdout.write(f"{pid}\n")
            sys.stdout.flush()


def _reap(status: Path) -> None:
    while True:
        try:
            pid, code = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        tmp = status / f".{pid}"
        tmp.write_text(str(os.waitstatus_to_exitcode(code)))
        tmp.rename(status / str(pid))


def _become(request: dict) -> None:
    import ctypes
    import runpy

    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    if request.get("deathsig"):
        ctypes.CDLL(None, use_errno=True).prctl(1, request["deathsig"])  # PR_SET_PDEATHSIG
        if os.getppid() == 1:  # the zygote died before the line above
            os._exit(1)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = [sys.argv[0], *request["args"]]
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)


# ---- the test process's side ---------------------------------------------------------------

class Forked:
    """The part of ``subprocess.Popen`` the tests use, for a process the zygote forked."""

    def __init__(self, pid: int, args: list[str], status: Path) -> None:
        self.pid, self.args, self._status = pid, args, status / str(pid)
        self.returncode: int | None = None
        self.stdout = self.stderr = self.stdin = None
        try:
            self._exited = os.pidfd_open(pid)
        except OSError:  # gone already
            self._exited = None

    def poll(self) -> int | None:
        if self.returncode is None and self._status.exists():
            self.returncode = int(self._status.read_text())
            if self._exited is not None:
                os.close(self._exited)
                self._exited = None
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            if self._exited is not None:  # readable once it has exited
                select.select([self._exited], [], [], None if left is None else left)
            # then a few ms until the zygote has reaped it and written its status
            time.sleep(0.005)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    def __init__(self, root: Path, env: dict[str, str], preexec_fn) -> None:
        import tempfile

        self.env = env
        self.status = Path(tempfile.mkdtemp(prefix="omnijobs-zygote-"))
        self._lock = threading.Lock()
        self._proc = subprocess.Popen(
            [sys.executable, "-c", "import tests.zygote as z; z.serve()", str(self.status)],
            cwd=root, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            preexec_fn=preexec_fn)

    def serves(self, env: dict[str, str], root: Path) -> bool:
        return (self._proc.poll() is None
                and interpreter_env(env) == interpreter_env(self.env)
                and env.get("PYTHONPATH", str(root)) == str(root)
                and "PROMETHEUS_MULTIPROC_DIR" not in env)

    def fork(self, module: str, args: list[str], env: dict[str, str], cwd: Path, log: Path,
             deathsig: int | None) -> Forked:
        request = {"module": module, "args": args, "env": env, "cwd": str(cwd),
                   "log": str(log), "deathsig": deathsig}
        with self._lock:
            self._proc.stdin.write((json.dumps(request) + "\n").encode())
            self._proc.stdin.flush()
            line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the zygote exited ({self._proc.poll()})")
        return Forked(int(line), [module, *args], self.status)

    def stop(self) -> None:
        import shutil

        if self._proc.poll() is None:
            self._proc.stdin.close()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        shutil.rmtree(self.status, ignore_errors=True)
