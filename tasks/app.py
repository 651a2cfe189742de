"""Celery application factory, and the worker's shutdown hooks.

Late acknowledgement, reject-on-worker-lost and prefetch 1: a message is only gone
once its job's state is recorded, and a GPU worker never hoards jobs it cannot start.
Redis's visibility timeout outlasts the longest time a live worker holds a message
(see ``visibility_timeout_s``), so the broker never hands a running job's message to a
second worker.
"""

from __future__ import annotations

import logging
import signal
import threading

from celery import Celery
from celery.signals import worker_ready, worker_shutdown, worker_shutting_down

from core.settings import Settings
from storage.redisconn import client_options

from .dispatch import MAINTENANCE_QUEUE

# A message waits in a worker (a retry's countdown, at most render.backoff_s's 5 minutes)
# before its task runs, and the task holds it until generation ends (at most the
# pipeline's maximum runtime): the visibility timeout leaves this much beyond that.
VISIBILITY_MARGIN_S = 900.0

log = logging.getLogger(__name__)
_stopping = threading.Event()  # this process has said it is stopping


def visibility_timeout_s(settings: Settings) -> float:
    """OMNIJOBS_VISIBILITY_TIMEOUT_S, else the longest maximum runtime of the enabled
    pipelines (those registered in this process) plus the margin."""
    if settings.visibility_timeout_s is not None:
        return settings.visibility_timeout_s
    from core.errors import ModelNotFound

    from .runtime import max_runtime_s

    limits = [3600.0]  # the spec default for video, when nothing here is registered
    for name in settings.pipelines:
        try:
            limits.append(max_runtime_s(settings, name))
        except ModelNotFound:  # a publisher (the API) need not have every module loaded
            continue
    return max(limits) + VISIBILITY_MARGIN_S


def broker_options(settings: Settings) -> dict:
    """Redis: the service's bounded connection options (storage/redisconn.py), on the
    publishing and the consuming side alike."""
    if not settings.broker.startswith("filesystem"):
        return {"visibility_timeout": visibility_timeout_s(settings), **client_options(settings)}
    folder = settings.broker_folder
    (folder / "processed").mkdir(parents=True, exist_ok=True)
    (folder / "control").mkdir(parents=True, exist_ok=True)
    return {"data_folder_in": str(folder), "data_folder_out": str(folder),
            "processed_folder": str(folder / "processed"), "store_processed": False,
            "control_folder": str(folder / "control"),
            "polling_interval": 0.2}


def make_celery(settings: Settings, with_tasks: bool = True) -> Celery:
    """``with_tasks=False`` gives a publisher only (the API): no worker code imported."""
    app = Celery("omnijobs", broker=settings.broker)
    options = broker_options(settings)
    if not with_tasks:  # a broker that is down must not hold a submit up: the outbox has it
        options |= {"max_retries": 1, "interval_start": 0}
    app.conf.update(
        broker_transport_options=options,
        broker_connection_retry_on_startup=True,
        broker_connection_timeout=3,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_ignore_result=True,
        worker_prefetch_multiplier=1,
        worker_send_task_events=True,
        task_send_sent_event=False,  # nothing reads them; each cost a PUBLISH per job
        task_default_queue=MAINTENANCE_QUEUE,
        worker_hijack_root_logger=False,
    )
    if settings.broker.startswith("filesystem"):  # the embedded broker, with lanes
        app.conf.broker_transport = "tasks.lanes:FilesystemTransport"
    elif settings.broker.startswith("redis://"):
        # kombu's, forgetting a message whose ack timed out (tasks/redis_transport.py); a
        # rediss:// URL keeps kombu's own, which takes TLS from the scheme
        app.conf.broker_transport = "tasks.redis_transport:Transport"
    if with_tasks:
        from . import deliver, render

        render.register(app)
        deliver.register(app)
    return app


def run_worker(app: Celery, node: str, queues: list[str], loglevel: str,
               threads: int = 0) -> None:
    """Celery's worker as ``celery --quiet worker -n NODE@%h -Q QUEUES -E --without-gossip
    --without-mingle`` runs it, on the solo pool or ``threads`` threads, ending as that
    command ends (SystemExit with a non-zero exit code). Not through Celery's command
    line: it parses nothing this needs, and it imports every subcommand and plugin first
    (click-repl, prompt_toolkit, Flower, Tornado), half a second of every worker's start."""
    from celery.utils.nodenames import default_nodename, host_format

    pool = {"pool_cls": "threads", "concurrency": threads} if threads else {"pool_cls": "solo"}
    worker = app.Worker(hostname=host_format(default_nodename(f"{node}@%h")), queues=queues,
                        loglevel=loglevel, quiet=True, task_events=True, without_gossip=True,
                        without_mingle=True, **pool)
    worker.start()
    if worker.exitcode:
        raise SystemExit(worker.exitcode)


@worker_ready.connect
def _ready(sender=None, **_kwargs) -> None:
    """The worker consumes: it enters the registry, and Ctrl-C (SIGINT) gets the
    SIGTERM handler, so both drain the same way (Celery's own SIGINT handler would turn
    a second signal into a cold shutdown that requeues the running job's message)."""
    from .runtime import _runtime

    if threading.current_thread() is threading.main_thread():
        _without_shutdown_print(getattr(sender, "controller", None))
        signal.signal(signal.SIGINT, signal.getsignal(signal.SIGTERM))
    if _runtime is not None:
        _runtime.drain.app = getattr(sender, "app", None)
        _runtime.announce()


def _without_shutdown_print(worker) -> None:
    """Celery's SIGTERM handler, less its bare ``worker: Warm shutdown (MainProcess)``
    print at every signal (between JSON lines, and once more per Ctrl-C passed on): the
    process logs its own stop once, in its log format (``_begin_drain``)."""
    from celery.apps.worker import install_worker_term_handler

    if worker is not None:
        install_worker_term_handler(worker, verbose=False)


@worker_shutting_down.connect
def _begin_drain(**_kwargs) -> None:
    """SIGTERM or SIGINT, in the signal handler: a render worker stops claiming now and
    drains in a thread, which says so (the maintenance process, which renders nothing,
    just stops, and says that once)."""
    from .runtime import _runtime

    first = not _stopping.is_set()
    _stopping.set()  # before anything else: a second signal may interrupt this handler
    if _runtime is not None and _runtime.served:
        _runtime.drain.begin()
    elif first:
        log.info("stopping: the maintenance steps end; webhook deliveries being sent finish")


@worker_shutdown.connect
def _drain_finalize(**_kwargs) -> None:
    """A warm shutdown lets in-flight finalizes finish (the drain hands them back at its
    bound); a hard kill leaves them to the reaper."""
    from .runtime import _runtime

    if _runtime is not None:
        _runtime.finalizer.drain()
        _runtime.drain.settle()
        _runtime.retire()
