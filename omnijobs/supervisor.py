"""The worker's supervisor: a light parent process that never touches an accelerator.
It runs the render worker as its child, forwards each stop signal once, and starts a
fresh child when the worker exits asking for a restart (a dead engine, a job past its
maximum runtime). With a metrics port it serves the sum of every child's metrics."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tasks.exit_codes import RESTART_EXIT

from . import console
from .released import wait_released
from .serve_cli import metrics_folder, serve_summed


def supervised(metrics_port: int | None) -> int:
    """The supervisor; with ``metrics_port``, it serves the sum of this and every later
    child's metrics (a fresh child does not start its counters over)."""
    args = [*without_option(sys.argv[1:], "--metrics-port"), "--no-supervise"]
    if metrics_port is None:
        return supervise(args)
    console.require_free_port("0.0.0.0", metrics_port, "--metrics-port")
    with metrics_folder() as folder:
        serve_summed(metrics_port, "0.0.0.0", folder)
        return supervise(args, folder)


def without_option(args: list[str], name: str) -> list[str]:
    """``args`` less ``name VALUE`` and ``name=VALUE``."""
    kept, skip = [], False
    for arg in args:
        if skip or arg.startswith(name + "="):
            skip = False
            continue
        skip = arg == name
        if not skip:
            kept.append(arg)
    return kept


def die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: the worker gets SIGKILL if its supervisor dies, so none is orphaned."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


CRASH_LIMIT = 5  # deaths by a signal in a row, each soon after its start, before giving up
HEALTHY_S = 60.0  # a worker that ran this long before it was killed starts the count over
MAX_BACKOFF_S = 30.0


def supervise(args: list[str], metrics: Path | None = None) -> int:
    """Start the worker; start a fresh one when it asks for a restart (RESTART_EXIT) or
    when a signal nobody here sent kills it (the OOM killer, an operator's kill -9): that
    death is logged with the signal's name, and the fresh worker starts after a backoff
    (1 s, doubling, at most MAX_BACKOFF_S), up to CRASH_LIMIT deaths in a row. A worker
    that exits by itself with another code (a refusal it explained) ends the supervisor
    with that code: starting it again would only refuse again."""
    log = logging.getLogger("omnijobs.supervisor")
    child: subprocess.Popen | None = None
    stopping = False
    stopped = threading.Event()
    crashes = 0

    def forward(signum, _frame) -> None:
        """Each signal reaches the worker once: it runs in a process group of its own,
        so a terminal's Ctrl-C is not delivered to it a second time (a second signal
        means "hand back now"). After one, no fresh worker is started."""
        nonlocal stopping
        stopping = True
        stopped.set()
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)
    while True:
        started = time.monotonic()
        child = subprocess.Popen([sys.executable, "-m", "omnijobs.cli", *args],
                                 preexec_fn=die_with_parent, process_group=0)
        code = child.wait()
        if metrics is not None:  # its live gauges go; its counters stay in the sum
            from prometheus_client.multiprocess import mark_process_dead

            mark_process_dead(child.pid, path=str(metrics))
        if stopping or (code != RESTART_EXIT and code >= 0):
            return code
        wait_released(child.pid)  # its stages, and the GPU memory they held
        if code == RESTART_EXIT:
            crashes = 0
            log.warning("worker exited for a restart; starting a fresh one")
            continue
        name = signal.Signals(-code).name
        crashes = crashes + 1 if time.monotonic() - started < HEALTHY_S else 1
        if crashes > CRASH_LIMIT:
            log.error("worker (pid %d) was killed by %s, %d times in a row within %g s of "
                      "its start; giving up", child.pid, name, crashes, HEALTHY_S)
            return 128 - code
        delay = min(MAX_BACKOFF_S, 2.0 ** (crashes - 1))
        log.error("worker (pid %d) was killed by %s; starting a fresh one in %g s (%d of "
                  "%d in a row)", child.pid, name, delay, crashes, CRASH_LIMIT)
        if stopped.wait(delay):
            return 128 - code
