"""``omnijobs worker`` (a render worker under its supervisor) and ``omnijobs
maintenance`` (the one process per deployment that relays, reaps and sweeps)."""

from __future__ import annotations

import os
import re
import sys
from typing import Annotated

import typer

from . import console, startup
from .options import LogLevel, load_settings, start_logging
from .supervisor import supervised


def worker(
    pipeline: Annotated[list[str] | None, typer.Option(
        help="Pipeline(s) to serve; default: every enabled one")] = None,
    gpu: Annotated[str | None, typer.Option(
        help="Pin this process to its GPU(s): 0, or 2,3,4,5,6,7 for a multi-GPU deploy")] = None,
    metrics_port: Annotated[int | None, typer.Option(help="Serve Prometheus metrics")] = None,
    log_level: LogLevel = "INFO",
    supervise: Annotated[bool, typer.Option(hidden=True)] = True,
    maintenance: Annotated[bool, typer.Option(
        hidden=True, help="Ignored: render workers never run maintenance")] = False,
) -> None:
    """Run a render worker: one process, models loaded once before it takes jobs.

    A light supervisor process (which never touches an accelerator) runs the worker as
    its child and starts a fresh one whenever the worker exits asking for a restart
    (a dead inference engine, a job past its maximum runtime). Maintenance runs
    elsewhere (``omnijobs maintenance``)."""
    if gpu is not None:
        if not re.fullmatch(r"\d+(,\d+)*", gpu):
            raise typer.BadParameter("a GPU index or a comma-separated list", param_hint="--gpu")
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    if supervise:
        raise typer.Exit(supervised(metrics_port))
    _run_worker(pipeline, metrics_port, log_level.upper())


def _run_worker(pipeline: list[str] | None, metrics_port: int | None, loglevel: str) -> None:
    from core.errors import EngineStartTimeout
    from pipelines import get_spec, served_pipelines
    from tasks.app import make_celery, run_worker
    from tasks.exit_codes import RESTART_EXIT
    from tasks.runtime import get_runtime

    start_logging(loglevel)
    settings = load_settings()
    runtime = get_runtime(settings)  # registers the pipeline modules
    names = served_pipelines(pipeline, settings.pipelines)
    if metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(metrics_port)
    try:
        runtime.warm(names)  # a refusal here stays one line: the start-up line comes after
    except EngineStartTimeout as exc:  # a fresh process may make it: the supervisor's code
        print(f"omnijobs: {exc.message}; exiting for a restart", file=sys.stderr)
        raise SystemExit(RESTART_EXIT) from None
    startup.log_start(settings, "worker", names, runtime.slots.total)
    queues = [get_spec(n).queue for n in names]
    # One job at a time on the solo pool; an engine with several slots gets as many
    # render threads in this process, all feeding it (tasks/slots.py).
    threads = 0 if runtime.slots.total == 1 else runtime.slots.total
    try:
        run_worker(make_celery(settings), f"omnijobs-{os.getpid()}", queues, loglevel,
                   threads=threads)
    finally:
        runtime.close_engines()  # after Celery's warm shutdown drained in-flight work
        if runtime.restart_requested:
            os._exit(RESTART_EXIT)


def maintenance(log_level: LogLevel = "INFO", metrics_port: Annotated[int | None, typer.Option(
        help="Serve Prometheus metrics, the fleet's queue gauges among them")] = None) -> None:
    """Run the maintenance process, one per deployment: outbox relay, lease reaper,
    lost-message sweep, retention, orphan sweep, outbox pruning, batches, and the CPU
    queues (webhook deliveries). It never renders, so render work cannot hold it up."""
    from api.batch_lines import line_checker
    from tasks.app import make_celery
    from tasks.maintenance import run
    from tasks.runtime import get_runtime

    if metrics_port is not None:
        console.require_free_port("0.0.0.0", metrics_port, "--metrics-port")
    start_logging(log_level)
    settings = load_settings()
    startup.log_start(settings, "maintenance")
    runtime = get_runtime(settings)
    runtime.check_line = line_checker(settings)  # batch lines: the API's own contract
    run(runtime, make_celery(settings), log_level.upper(), metrics_port=metrics_port)


def beat(log_level: LogLevel = "INFO") -> None:
    """Same as ``omnijobs maintenance`` (its former name)."""
    maintenance(log_level, None)
