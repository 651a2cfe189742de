"""The worker's supervisor: a light parent process that never touches an accelerator.
It runs the render worker as its child, forwards each stop signal once, and starts a
fresh child when the worker exits asking for a restart (a dead engine, a job past its
maximum runtime). With a metrics port it serves the sum of every child's metrics."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
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


def supervise(args: list[str], metrics: Path | None = None) -> int:
    log = logging.getLogger("omnijobs.supervisor")
    child: subprocess.Popen | None = None
    stopping = False

    def forward(signum, _frame) -> None:
        """Each signal reaches the worker once: it runs in a process group of its own,
        so a terminal's Ctrl-C is not delivered to it a second time (a second signal
        means "hand back now"). After one, no fresh worker is started."""
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)
    while True:
        child = subprocess.Popen([sys.executable, "-m", "omnijobs.cli", *args],
                                 preexec_fn=die_with_parent, process_group=0)
        code = child.wait()
        if metrics is not None:  # its live gauges go; its counters stay in the sum
            from prometheus_client.multiprocess import mark_process_dead

            mark_process_dead(child.pid, path=str(metrics))
        if code != RESTART_EXIT or stopping:
            return code
        wait_released(child.pid)  # its stages, and the GPU memory they held
        log.warning("worker exited for a restart; starting a fresh one")
