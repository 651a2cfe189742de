"""Per-process worker state: database, object store and loaded pipelines.

Built once per worker process. Pipelines are loaded (weights and all) the first
time they are needed, or up front by ``warm()`` before the worker takes jobs; the
worker runs the solo pool, so nothing that touched an accelerator is ever forked.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
from collections.abc import Callable
from functools import cached_property

from core.settings import Settings
from pipelines import Pipeline, get_pipeline_class, get_spec, import_pipeline_modules
from storage.bus import Bus, make_bus
from storage.db import DbBounds, make_engine, make_sessionmaker
from storage.objects import ObjectStore, make_store
from storage.repositories import (
    BatchRepository,
    FileRepository,
    JobRepository,
    OutboxRepository,
    WebhookRepository,
)

from .pool import FinalizePool

log = logging.getLogger(__name__)


class WorkerRuntime:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        import_pipeline_modules(settings.pipeline_modules)
        sessions = make_sessionmaker(make_engine(settings.db_url, DbBounds.for_tasks(settings)))
        self.jobs = JobRepository(sessions)
        self.outbox = OutboxRepository(sessions)
        self.webhooks = WebhookRepository(sessions)
        self.batches = BatchRepository(sessions)
        self.files = FileRepository(sessions)
        # Batch lines are checked by the API's own contract, which the composition root
        # hands in to the processes that validate batches (tasks do not import the API).
        self.check_line: Callable | None = None
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}"
        self._pipelines: dict[str, Pipeline] = {}
        self.finalizer = FinalizePool(settings.finalize_backlog)
        self.restart_requested = False

    @cached_property
    def store(self) -> ObjectStore:
        return make_store(self.settings)

    @cached_property
    def bus(self) -> Bus | None:
        """Live notices and streamed audio (None where the bus cannot be built)."""
        try:
            return make_bus(self.settings)
        except Exception:
            log.warning("live bus unavailable; jobs run without live events", exc_info=True)
            return None

    def pipeline(self, name: str) -> Pipeline:
        if name not in self._pipelines:
            options = self.settings.pipeline_options.get(name, {})
            instance = get_pipeline_class(name)(options)
            instance.load()
            self._pipelines[name] = instance
        return self._pipelines[name]

    def max_runtime_s(self, name: str) -> float:
        """The pipeline's maximum runtime: its spec's, or ``max_runtime_s`` in its
        ``OMNIJOBS_PIPELINE_OPTIONS`` entry."""
        options = self.settings.pipeline_options.get(name, {})
        return float(options.get("max_runtime_s", get_spec(name).runtime_limit_s))

    def warm(self, names: list[str]) -> None:
        for name in names:
            self.pipeline(name)

    def request_restart(self) -> None:
        """Stop taking jobs and exit with RESTART_EXIT so the supervisor starts a fresh
        process (a dead inference engine must not poison later jobs)."""
        self.restart_requested = True
        os.kill(os.getpid(), signal.SIGTERM)

    def recycle(self) -> None:
        """Exit now with RESTART_EXIT: a pipeline call stuck past its maximum runtime
        cannot be interrupted, and a warm shutdown would wait for it forever. The
        supervisor starts a fresh process; another job in flight here is reclaimed by the
        reaper once its lease runs out."""
        log.error("recycling the worker process (a job ran past its maximum runtime)")
        os._exit(RESTART_EXIT)


RESTART_EXIT = 75  # EX_TEMPFAIL: "start me again"

_runtime: WorkerRuntime | None = None


def get_runtime(settings: Settings | None = None) -> WorkerRuntime:
    global _runtime
    if _runtime is None:
        _runtime = WorkerRuntime(settings or Settings())
    return _runtime
