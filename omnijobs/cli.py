"""``omnijobs``: the console script and the composition root. Nothing imports it."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from typing import Annotated

import typer

from core.settings import Settings

cli = typer.Typer(help="omnijobs: durable speech and video jobs.", no_args_is_help=True)
keys_cli = typer.Typer(help="Manage API keys.", no_args_is_help=True)
cli.add_typer(keys_cli, name="keys")


def _settings() -> Settings:
    settings = Settings()
    settings.home.mkdir(parents=True, exist_ok=True)
    return settings


def _logging(level: str = "INFO") -> None:
    """JSON lines on stderr; ``extra={"job_id": ...}`` on a record becomes a field."""
    from pythonjsonlogger.json import JsonFormatter

    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter("%(asctime)s %(levelname)s %(name)s %(message)s",
                                       rename_fields={"levelname": "level",
                                                      "asctime": "time"}))
    logging.basicConfig(level=level, handlers=[handler], force=True)


@cli.command()
def migrate() -> None:
    """Bring the database schema up to date (Alembic)."""
    from storage.migrate import upgrade

    settings = _settings()
    upgrade(settings.db_url)
    typer.echo("database is at the latest revision")


@keys_cli.command("create")
def keys_create(tenant: Annotated[str, typer.Option(help="Tenant name (created if new)")]
                ) -> None:
    """Create an API key for TENANT; the key is printed alone on the last line."""
    from storage.db import make_engine, make_sessionmaker
    from storage.repositories import KeyRepository

    settings = _settings()
    tenant_id, key = KeyRepository(make_sessionmaker(make_engine(settings.db_url))).create_key(
        tenant)
    typer.echo(f"tenant {tenant} ({tenant_id}): new API key below; it is shown only once")
    typer.echo(key)


def build_api(settings: Settings):
    from api.app import create_app
    from tasks.app import make_celery
    from tasks.dispatch import publish

    celery = make_celery(settings, with_tasks=False)

    def broker_check() -> None:
        with celery.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)

    return create_app(settings, lambda msg: publish(celery, msg), broker_check)


@cli.command()
def api(host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> None:
    """Serve the HTTP API."""
    import uvicorn

    _logging(log_level.upper())
    uvicorn.run(build_api(_settings()), host=host, port=port, log_level=log_level,
                log_config=None)


@cli.command()
def worker(
    pipeline: Annotated[list[str] | None, typer.Option(
        help="Pipeline(s) to serve; default: every enabled one")] = None,
    gpu: Annotated[int | None, typer.Option(help="Pin this process to one GPU")] = None,
    metrics_port: Annotated[int | None, typer.Option(help="Serve Prometheus metrics")] = None,
    loglevel: str = "INFO",
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
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)
    if supervise:
        raise typer.Exit(_supervise([*sys.argv[1:], "--no-supervise"]))
    _run_worker(pipeline, metrics_port, loglevel)


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: the worker gets SIGKILL if its supervisor dies, so none is orphaned."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _supervise(args: list[str]) -> int:
    from tasks.runtime import RESTART_EXIT

    log = logging.getLogger("omnijobs.supervisor")
    child: subprocess.Popen | None = None

    def forward(signum, _frame) -> None:
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)
    while True:
        child = subprocess.Popen([sys.executable, "-m", "omnijobs.cli", *args],
                                 preexec_fn=_die_with_parent)
        code = child.wait()
        if code != RESTART_EXIT:
            return code
        log.warning("worker exited for a restart; starting a fresh one")


def _run_worker(pipeline: list[str] | None, metrics_port: int | None, loglevel: str) -> None:
    from pipelines import get_spec
    from tasks.app import make_celery
    from tasks.runtime import RESTART_EXIT, get_runtime

    _logging(loglevel)
    settings = _settings()
    names = pipeline or settings.pipelines
    if metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(metrics_port)
    runtime = get_runtime(settings)
    runtime.warm(names)
    queues = [get_spec(n).queue for n in names]
    argv = ["worker", "--pool=solo", "-Q", ",".join(queues), f"--loglevel={loglevel}",
            "-n", f"omnijobs-{os.getpid()}@%h", "--without-gossip", "--without-mingle", "-E"]
    try:
        make_celery(settings).worker_main(argv)
    finally:
        if runtime.restart_requested:
            os._exit(RESTART_EXIT)  # after Celery's warm shutdown drained in-flight work


@cli.command()
def maintenance(loglevel: str = "INFO") -> None:
    """Run the maintenance process, one per deployment: outbox relay, lease reaper,
    lost-message sweep, retention, orphan sweep, outbox pruning, and the CPU queues
    (webhook deliveries). It never renders, so render work cannot hold it up."""
    from tasks.app import make_celery
    from tasks.maintenance import run
    from tasks.runtime import get_runtime

    _logging(loglevel)
    settings = _settings()
    run(get_runtime(settings), make_celery(settings), loglevel)


@cli.command()
def beat(loglevel: str = "INFO") -> None:
    """Same as ``omnijobs maintenance`` (its former name)."""
    maintenance(loglevel)


def _dev_key(settings: Settings) -> str:
    from storage.db import make_engine, make_sessionmaker
    from storage.repositories import KeyRepository

    keys = KeyRepository(make_sessionmaker(make_engine(settings.db_url)))
    path = settings.home / "dev-api-key"
    if path.exists() and keys.authenticate(path.read_text().strip()):
        return path.read_text().strip()
    _, key = keys.create_key("dev")
    path.write_text(key + "\n")
    path.chmod(0o600)
    return key


@cli.command()
def dev(host: str = "127.0.0.1", port: int = 8000) -> None:
    """Embedded mode: SQLite, filesystem broker, local object store, worker, maintenance
    and API."""
    import uvicorn

    from storage.migrate import upgrade

    _logging()
    settings = _settings()
    if settings.mode != "embedded":
        raise typer.BadParameter("omnijobs dev runs the embedded mode only")
    os.environ.setdefault("OMNIJOBS_PUBLIC_BASE_URL", f"http://{host}:{port}")
    settings = _settings()
    upgrade(settings.db_url)
    key = _dev_key(settings)
    children = [subprocess.Popen([sys.executable, "-m", "omnijobs.cli", role],
                                 preexec_fn=_die_with_parent)
                for role in ("worker", "maintenance")]

    def stop_children(*_args) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in children:
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
        raise SystemExit(0)

    # uvicorn re-raises SIGINT/SIGTERM after its graceful shutdown; this handler then
    # stops the worker and maintenance too, so nothing outlives `omnijobs dev`.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop_children)
    typer.echo(f"\nomnijobs is starting on http://{host}:{port}\nAPI key: {key}\n\n"
               "Try:\n"
               f"  curl -sS http://{host}:{port}/v1/audio/speech \\\n"
               f"    -H 'Authorization: Bearer {key}' -H 'Content-Type: application/json' \\\n"
               "    -d '{\"model\": \"tts-1\", \"voice\": \"alloy\", \"response_format\": "
               "\"wav\", \"input\": \"Hello from omnijobs.\"}' \\\n"
               "    -o hello.wav\n")
    try:
        uvicorn.run(build_api(settings), host=host, port=port, log_level="info",
                    log_config=None)
    finally:
        stop_children()


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
