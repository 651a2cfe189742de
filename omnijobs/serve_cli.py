"""``omnijobs api``: the HTTP API, in one process or ``--workers N`` behind one port,
with metrics that add up across those processes."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from core.settings import PLACEHOLDER_SECRETS, Settings

from . import console, startup
from .options import LogLevel, Port, load_settings, start_logging


def is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def refuse_exposed_placeholder(settings: Settings, host: str) -> None:
    """The local store's URLs are signed with the signing secret: with the public
    placeholder, anyone who can reach the port could forge them."""
    if not is_loopback(host) and (settings.signing_secret in PLACEHOLDER_SECRETS
                                   or len(settings.signing_secret) < 16):
        raise typer.BadParameter(
            f"refusing to serve on {host} with the placeholder signing secret: set "
            "OMNIJOBS_SIGNING_SECRET (16+ characters) or bind 127.0.0.1", param_hint="--host")


def build_api(settings: Settings):
    from functools import partial

    from api.app import create_app
    from media.stream import STREAMABLE, stream_encoder
    from tasks.app import make_celery
    from tasks.deliver import send_test
    from tasks.dispatch import publish
    from tasks.publish import publish_many

    celery = make_celery(settings, with_tasks=False)

    def broker_check() -> None:
        with celery.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)

    return create_app(settings, lambda msg: publish(celery, msg), broker_check,
                      webhook_tester=partial(send_test, settings),
                      publish_many=lambda msgs: publish_many(celery, msgs),
                      stream_encoder=stream_encoder, streamable=STREAMABLE)


# ---- metrics that add up across the processes of one command ------------------------
# `api --workers N` runs N processes behind one port, and `worker` a supervisor whose
# child is replaced on a restart: a scrape of one process would answer for it alone. So
# their processes run in prometheus_client's multiprocess mode, writing their metrics to
# files in one folder (PROMETHEUS_MULTIPROC_DIR, exported before the children start, so
# they inherit it), and the parent serves their sum. A process that exited keeps its
# counts in the sum, so no counter goes down.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


@contextmanager
def metrics_folder() -> Iterator[Path]:
    """The folder named by PROMETHEUS_MULTIPROC_DIR (emptied: no earlier run's files) or
    a fresh one, removed afterwards."""
    import shutil
    import tempfile

    named = os.environ.get(MULTIPROC_ENV)
    folder = Path(named) if named else Path(tempfile.mkdtemp(prefix="omnijobs-metrics-"))
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("*.db"):
        stale.unlink()
    os.environ[MULTIPROC_ENV] = str(folder)
    try:
        yield folder
    finally:
        if not named:
            shutil.rmtree(folder, ignore_errors=True)


def serve_summed(port: int, host: str, folder: Path) -> None:
    """The sum of every process's metrics in ``folder``, on ``port`` (a thread here)."""
    from prometheus_client import CollectorRegistry, start_http_server
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(folder))
    start_http_server(port, addr=host, registry=registry)


API_LOG_LEVEL = "OMNIJOBS_API_WORKER_LOG_LEVEL"  # handed to --workers' processes


def api(host: str = "127.0.0.1", port: Port = None, log_level: LogLevel = "info",
        metrics_port: Annotated[int | None, typer.Option(
            help="Serve Prometheus metrics on this port (same host; with --workers N, "
            "the sum over the N processes)")] = None,
        workers: Annotated[int, typer.Option(
            min=1, help="API processes sharing the port (uvicorn workers); each has its "
            "own threads and database pool")] = 1) -> None:
    """Serve the HTTP API (``/metrics`` only on --metrics-port unless
    OMNIJOBS_METRICS_PUBLIC=true)."""
    import uvicorn

    settings = load_settings()
    port = settings.port if port is None else port
    refuse_exposed_placeholder(settings, host)
    console.require_free_port(host, port)
    if metrics_port is not None:
        console.require_free_port(host, metrics_port, "--metrics-port")
    start_logging(log_level)
    startup.log_start(settings, "api")
    if workers == 1:
        if metrics_port is not None:
            from prometheus_client import start_http_server

            start_http_server(metrics_port, addr=host)
        from api.app import quiet_collector

        app = build_api(settings)
        quiet_collector()
        uvicorn.run(app, host=host, port=port, log_level=log_level.lower(),
                    log_config=None, access_log=False)
        return
    with metrics_folder() as folder:  # before the processes start: they inherit it
        if metrics_port is not None:
            serve_summed(metrics_port, host, folder)
        os.environ[API_LOG_LEVEL] = log_level
        uvicorn.run("omnijobs.serve_cli:api_worker_app", factory=True, workers=workers, host=host,
                    port=port, log_level=log_level.lower(), log_config=None, access_log=False)


def api_worker_app():
    """The app of one ``omnijobs api --workers N`` process (uvicorn starts each afresh:
    settings from the environment, logging as the parent's)."""
    from api.app import quiet_collector

    start_logging(os.environ.get(API_LOG_LEVEL, "info"))
    app = build_api(load_settings())
    quiet_collector()
    return app
