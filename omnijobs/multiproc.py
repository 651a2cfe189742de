"""Metrics that add up across the processes of one command.

``omnijobs api --workers N`` runs N processes behind one port, and ``omnijobs worker``
a supervisor whose child is replaced on a restart: a scrape of any one process would
answer for that process alone (counters jumping between processes, or starting over).
So these commands put their processes in prometheus_client's multiprocess mode: each
process writes its metrics to files in one folder (``PROMETHEUS_MULTIPROC_DIR``, set here
before the children start, so they inherit it) and the parent serves their sum on the
metrics port. Counters of a process that exited stay in the sum, so no counter ever
goes down.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

ENV = "PROMETHEUS_MULTIPROC_DIR"


def shared_folder() -> Path:
    """The folder this command's processes write their metrics to: the one named by
    ``PROMETHEUS_MULTIPROC_DIR`` (emptied: it must not mix in an earlier run's files)
    or a fresh one. Exported, so the children started after this inherit it."""
    named = os.environ.get(ENV)
    folder = Path(named) if named else Path(tempfile.mkdtemp(prefix="omnijobs-metrics-"))
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("*.db"):
        stale.unlink()
    os.environ[ENV] = str(folder)
    return folder


def serve(port: int, host: str, folder: Path) -> None:
    """The sum of every process's metrics, on ``port`` (a thread of this process)."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(folder))
    start_http_server(port, addr=host, registry=registry)


def process_exited(pid: int, folder: Path) -> None:
    """Drop a dead process's live gauges (its counters stay in the sum)."""
    mark_process_dead(pid, path=str(folder))
