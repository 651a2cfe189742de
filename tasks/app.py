"""Celery application factory.

Late acknowledgement, reject-on-worker-lost and prefetch 1: a message is only gone
once its job's state is recorded, and a GPU worker never hoards jobs it cannot start.
"""

from __future__ import annotations

from celery import Celery
from celery.signals import worker_shutdown

from core.settings import Settings
from storage.redisconn import client_options

from .dispatch import MAINTENANCE_QUEUE


def broker_options(settings: Settings) -> dict:
    """Redis: the service's bounded connection options (storage/redisconn.py), on the
    publishing and the consuming side alike."""
    if not settings.broker.startswith("filesystem"):
        return {"visibility_timeout": 3600, **client_options(settings)}
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


@worker_shutdown.connect
def _drain_finalize(**_kwargs) -> None:
    """A warm shutdown lets in-flight finalizes finish; a hard kill leaves them to the
    reaper."""
    from .runtime import _runtime

    if _runtime is not None:
        _runtime.finalizer.drain()
