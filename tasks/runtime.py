"""Per-process worker state: database, object store, loaded pipelines, and the drain.

Built once per worker process. Pipelines are loaded (weights and all) the first
time they are needed, or up front by ``warm()`` before the worker takes jobs; the
worker runs the solo pool, or threads in this one process when its engine has several
slots (tasks/slots.py), so nothing that touched an accelerator is ever forked.

Scale-in is a drain (``Drain``): on SIGTERM or SIGINT the worker claims nothing more,
gives the jobs it holds until the drain bound to finish, then hands each one still
unfinished back to the queue (a compare-and-set in the jobs repository, with its render
message published at once) and exits. A second signal hands back at once.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from functools import cached_property

from celery import Celery

from core.settings import Settings
from pipelines import (
    Pipeline,
    get_pipeline_class,
    get_spec,
    import_pipeline_modules,
    queue_for,
)
from storage.bus import Bus, make_bus
from storage.db import DbBounds, make_engine, make_sessionmaker
from storage.objects import ObjectStore, make_store
from storage.records import InFlightJob
from storage.repositories import (
    BatchRepository,
    FileRepository,
    JobRepository,
    OutboxRepository,
    QueueRepository,
    WebhookRepository,
    WorkerRepository,
)

from .dispatch import publish_and_mark
from .exit_codes import RESTART_EXIT
from .lease import InFlight
from .pool import FinalizePool
from .presence import Presence, SlotView, describe
from .slots import SlotGate

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
        self.workers = WorkerRepository(sessions)
        self.queues = QueueRepository(sessions)
        # Batch lines are checked by the API's own contract, which the composition root
        # hands in to the processes that validate batches (tasks do not import the API).
        self.check_line: Callable | None = None
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}"
        self._pipelines: dict[str, Pipeline] = {}
        self._loading = threading.Lock()  # render threads share the process's pipelines
        self.slots = SlotGate(1)  # until warm() knows what the engines hold
        self.finalizer = FinalizePool(settings.finalize_backlog)
        self.restart_requested = False
        self._restart_lock = threading.Lock()
        self.served: list[str] = []  # the pipelines this worker warmed and takes jobs for
        self.in_flight = InFlight()  # the jobs it holds (leases), from claim to recorded
        self.drain = Drain(self)
        self.presence: Presence | None = None

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
        with self._loading:
            if name not in self._pipelines:
                options = self.settings.pipeline_options.get(name, {})
                instance = get_pipeline_class(name)(options)
                instance.load()
                self._pipelines[name] = instance
            return self._pipelines[name]

    def max_runtime_s(self, name: str) -> float:
        return max_runtime_s(self.settings, name)

    def warm(self, names: list[str]) -> None:
        """Load the served pipelines, and size the slots: the fewest any of them allows
        (one engine per process; a worker that also serves a one-at-a-time pipeline
        keeps to one)."""
        for name in names:
            self.pipeline(name)
        self.served = list(names)
        self.slots = SlotGate(min((self.pipeline(n).slots() for n in names), default=1))
        if self.slots.total > 1:  # nothing was submitted to the one-thread pool yet
            self.finalizer = FinalizePool(self.settings.finalize_backlog,
                                          workers=min(MAX_FINALIZE_THREADS, self.slots.total))
        self.store  # noqa: B018 - built now: not by the first upload, nor by two threads

    def slot_weight(self, pipeline: str, request: dict) -> int:
        return self.pipeline(pipeline).slot_weight(request)

    def slot_view(self) -> SlotView:
        """What the engine holds now, for the registry."""
        return SlotView(total=self.slots.total, busy=self.slots.busy, jobs=tuple(
            InFlightJob(lease.job_id, lease.pipeline, finalizing=lease.generated)
            for lease in self.in_flight.leases()))

    def announce(self, role: str = "worker") -> None:
        """Start this process's row in the worker registry (once it takes work)."""
        if self.presence is not None:
            return
        engine = any(get_pipeline_class(n).default_deploy for n in self.served)
        self.presence = Presence(self.workers, describe(self.worker_id, role, self.served,
                                                        engine),
                                 self.settings.worker_heartbeat_s,
                                 current_job=self.in_flight.newest,
                                 draining=lambda: self.drain.started,
                                 slots=self.slot_view).start()
        self.in_flight.on_change = self.presence.poke

    def retire(self) -> None:
        """Leave the registry: the process is exiting."""
        if self.presence is not None:
            self.presence.stop()

    def close_engines(self) -> None:
        """Shut each loaded pipeline's engine down, within its bound (the pipeline option
        ``shutdown_timeout_s``, else ENGINE_SHUTDOWN_S), before the process exits, so
        its stage processes free their GPUs before a fresh worker starts."""
        for name, pipeline in list(self._pipelines.items()):
            options = self.settings.pipeline_options.get(name, {})
            pipeline.close(float(options.get("shutdown_timeout_s", ENGINE_SHUTDOWN_S)))

    def request_restart(self) -> None:
        """Stop taking jobs and exit with RESTART_EXIT so the supervisor starts a fresh
        process (a dead inference engine must not poison later jobs). One signal however
        many jobs ask: an engine that dies fails every job in flight, and a second
        SIGTERM is an operator's "hand everything back now"."""
        with self._restart_lock:
            if self.restart_requested:
                return
            self.restart_requested = True
        os.kill(os.getpid(), signal.SIGTERM)

    def recycle(self) -> None:
        """Exit now with RESTART_EXIT: a pipeline call stuck past its maximum runtime
        cannot be interrupted, and a warm shutdown would wait for it forever. The
        supervisor starts a fresh process; another job in flight here is reclaimed by the
        reaper once its lease runs out."""
        log.error("recycling the worker process (a job ran past its maximum runtime)")
        self.retire()
        self.close_engines()
        os._exit(RESTART_EXIT)


def max_runtime_s(settings: Settings, name: str) -> float:
    """The pipeline's maximum runtime: its spec's, or ``max_runtime_s`` in its
    ``OMNIJOBS_PIPELINE_OPTIONS`` entry."""
    options = settings.pipeline_options.get(name, {})
    return float(options.get("max_runtime_s", get_spec(name).runtime_limit_s))


MAX_FINALIZE_THREADS = 4  # a batch's jobs that end together upload side by side (pool.py)
ENGINE_SHUTDOWN_S = 30.0  # for an engine to stop its stages when the worker exits
HAND_BACK_GRACE_S = 5.0  # for a pipeline to notice a hand-back before the process exits


class Drain:
    """Scale-in without losing or repeating work (see the module's docstring).

    ``begin`` runs inside the signal handler, on the main thread (which may be in the
    middle of a pipeline call): it only sets flags and starts the drain's own thread.
    Claims are refused from that moment (``started``; the render task puts the message
    back on its queue). The thread waits for the jobs in flight, and at the bound hands
    back the ones left; a pipeline that notices (it stops at its next chunk) lets the
    warm shutdown end the process, one stuck in a call is left behind by ``os._exit``.
    """

    def __init__(self, rt: WorkerRuntime) -> None:
        self.rt = rt
        self.app: Celery | None = None  # to publish the render messages of handed-back jobs
        self._started, self._now = threading.Event(), threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def started(self) -> bool:
        return self._started.is_set()

    def bound_s(self) -> float:
        """``OMNIJOBS_DRAIN_S``, else the longest maximum runtime this worker serves (a
        job within it finishes, or times out, by then anyway)."""
        if self.rt.settings.drain_s is not None:
            return self.rt.settings.drain_s
        return max((self.rt.max_runtime_s(n) for n in self.rt.served), default=0.0)

    def begin(self, app: Celery | None = None) -> None:
        self.app = app or self.app
        if self._started.is_set():
            self._now.set()  # asked again: hand back now
            return
        self._started.set()
        self._thread = threading.Thread(target=self._run, name="drain", daemon=True)
        self._thread.start()

    def settle(self) -> None:
        """Before the process exits: let a hand-back in progress finish (its compare-and-
        set and publish), which ``_run`` bounds."""
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        bound = self.bound_s()
        log.warning("draining: no more claims; %d job(s) in flight have %gs to finish",
                    len(self.rt.in_flight.leases()), bound)
        if self.rt.presence is not None:
            self.rt.presence.poke()
        deadline = time.monotonic() + bound
        while not self._now.is_set():
            left = deadline - time.monotonic()
            if self.rt.in_flight.wait_empty(min(0.5, left)):
                return  # all done: Celery's warm shutdown ends the process
            if left <= 0:
                break
        self.hand_back_all()
        if self.rt.in_flight.wait_empty(HAND_BACK_GRACE_S):
            return
        log.warning("a pipeline call did not stop after its job was handed back; exiting")
        self.rt.retire()
        self.rt.close_engines()
        logging.shutdown()
        os._exit(0)

    def hand_back_all(self) -> int:
        handed = 0
        for lease in self.rt.in_flight.leases():
            lease.let_go()  # the pipeline and finalize stop at their next check
            try:
                msg = self.rt.jobs.hand_back(lease.job_id, lease.attempt,
                                             queue=queue_for(lease.pipeline))
            except Exception:  # its lease runs out and the reaper re-queues it instead
                log.exception("could not hand job %s back", lease.job_id,
                              extra={"job_id": lease.job_id})
                continue
            if msg is None:  # it ended meanwhile (completed, cancelled)
                continue
            if self.app is not None:
                publish_and_mark(self.app, self.rt.outbox, msg)  # else the relay sends it
            handed += 1
            log.warning("job %s handed back (the worker is stopping)", lease.job_id,
                        extra={"job_id": lease.job_id})
        return handed

_runtime: WorkerRuntime | None = None


def get_runtime(settings: Settings | None = None) -> WorkerRuntime:
    global _runtime
    if _runtime is None:
        _runtime = WorkerRuntime(settings or Settings())
    return _runtime
