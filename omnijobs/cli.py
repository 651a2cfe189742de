"""``omnijobs``: the console script and the composition root. Nothing imports it."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from core.settings import PLACEHOLDER_SECRETS, Settings
from omnijobs.batch_cli import batch_cli
from omnijobs.usage_cli import usage_command

from . import console, local, startup

cli = console.commands(help="omnijobs: durable speech and video jobs.")
keys_cli = console.commands(help="Manage API keys.")
cli.add_typer(keys_cli, name="keys")
tenants_cli = console.commands(help="Tenants' shares of the queues.")
cli.add_typer(tenants_cli, name="tenants")
webhooks_cli = console.commands(help="Webhook signing secrets.")
cli.add_typer(webhooks_cli, name="webhooks")
cli.add_typer(batch_cli, name="batch")


# One spelling for every command's log level (the former ``--loglevel`` still works).
LogLevel = Annotated[str, typer.Option("--log-level", "--loglevel",
                                       help="DEBUG, INFO, WARNING or ERROR")]


@cli.callback()
def _options(debug: Annotated[bool, typer.Option(
        "--debug", help="Show the traceback of an error instead of one line")] = False
             ) -> None:
    """omnijobs: durable speech and video jobs."""  # --debug is read by console.run


def _settings(create_home: bool = True) -> Settings:
    settings = Settings()
    if create_home:
        settings.home.mkdir(parents=True, exist_ok=True)
    return settings


def _logging(level: str = "INFO") -> None:
    settings = Settings()
    console.setup_logging(level, settings.log_format, embedded=settings.mode == "embedded")


@cli.command()
def migrate() -> None:
    """Bring the database schema up to date (Alembic); says what it did."""
    from storage.migrate import upgrade, where

    settings = _settings()
    before, after = upgrade(settings.db_url)
    place = where(settings.db_url)
    if before == after:
        typer.echo(f"{place}: already at the latest revision ({after})")
    else:
        typer.echo(f"{place}: upgraded from {before or 'an empty database'} to {after}")


@cli.command()
def config(markdown: Annotated[bool, typer.Option(
        help="Print docs/configuration.md's table (every setting, its default and "
             "meaning) instead")] = False) -> None:
    """Print the effective settings, from OMNIJOBS_* variables (secrets hidden)."""
    if markdown:
        typer.echo(console.config_table())
        return
    typer.echo("\n".join(console.effective_settings(_settings(create_home=False))))


def _admin_db() -> str:
    """The database of an admin command, which must exist and be migrated: checked
    first, so a wrong folder or a missing ``migrate`` creates nothing."""
    from storage.migrate import require_schema

    settings = _settings(create_home=False)
    require_schema(settings.db_url)
    typer.echo(startup.database_line(settings), err=True)  # stdout stays for scripts
    return settings.db_url


cli.command("usage")(usage_command(_admin_db))


def _keys():
    from storage.db import make_engine, make_sessionmaker
    from storage.repositories import KeyRepository

    return KeyRepository(make_sessionmaker(make_engine(_admin_db())))


def _when(value) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%SZ") if value is not None else "-"


@keys_cli.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option(help="Tenant name (created if new)")],
    operator: Annotated[bool, typer.Option(
        help="An operator's key: the console (/console) shows it every tenant")] = False,
) -> None:
    """Create an API key for TENANT; the key is printed alone on the last line."""
    tenant_id, key = _keys().create_key(tenant, operator=operator)
    kind = "operator key (the console shows every tenant)" if operator else "API key"
    typer.echo(f"tenant {tenant} ({tenant_id}): new {kind} below; it is shown only once")
    typer.echo(key)


@webhooks_cli.command("secret")
def webhooks_secret(
    tenant: Annotated[str, typer.Option(help="Tenant name")],
    rotate: Annotated[bool, typer.Option(help="Make a new secret; the old one stays valid "
                                              "for 24 hours")] = False,
) -> None:
    """Print TENANT's default secret (signs per-job webhook_url deliveries) alone on the
    last line, creating it if there is none."""
    from storage.db import make_engine, make_sessionmaker
    from storage.repositories import WebhookRepository

    hooks = WebhookRepository(make_sessionmaker(make_engine(_admin_db())))
    tenant_id = hooks.tenant_id(tenant)
    if tenant_id is None:
        typer.echo(f"no tenant named {tenant!r}", err=True)
        raise typer.Exit(1)
    record = hooks.rotate_default_secret(tenant_id) if rotate else hooks.default_secret(
        tenant_id)
    if rotate:
        typer.echo(f"tenant {tenant}: new default webhook secret below; the previous one "
                   f"stays valid until {record.previous_expires_at:%Y-%m-%d %H:%M} UTC")
    else:
        typer.echo(f"tenant {tenant}: default webhook secret")
    typer.echo(record.secret)


@keys_cli.command("list")
def keys_list(tenant: Annotated[str, typer.Option(help="Tenant name")]) -> None:
    """List TENANT's keys: prefix, created, last used, revoked (never the keys)."""
    from core.errors import NotFound

    try:
        keys = _keys().list_keys(tenant)
    except NotFound as exc:
        raise typer.BadParameter(exc.message, param_hint="--tenant") from None
    typer.echo(f"{'prefix':<12} {'created':<20} {'last used':<20} revoked")
    for k in keys:
        typer.echo(f"{k.prefix:<12} {_when(k.created_at):<20} {_when(k.last_used_at):<20} "
                   f"{_when(k.revoked_at)}")


@keys_cli.command("revoke")
def keys_revoke(prefix: Annotated[str, typer.Argument(help="The key's prefix, as listed")]
                ) -> None:
    """Revoke a key: every API process refuses it within OMNIJOBS_AUTH_CACHE_TTL_S."""
    from core.errors import OmniJobsError

    try:
        key = _keys().revoke(prefix)
    except OmniJobsError as exc:
        raise typer.BadParameter(exc.message, param_hint="PREFIX") from None
    typer.echo(f"key {key.prefix} of tenant {key.tenant} revoked at {_when(key.revoked_at)}")


def _shares():
    from storage.db import make_engine, make_sessionmaker
    from storage.repositories.shares import ShareRepository

    return ShareRepository(make_sessionmaker(make_engine(_admin_db())))


@tenants_cli.command("weight")
def tenants_weight(
    tenant: Annotated[str, typer.Argument(help="Tenant name (or id)")],
    weight: Annotated[float, typer.Argument(help="Its share: 3 gets three jobs started for "
                                                 "each one of a tenant of weight 1")],
) -> None:
    """Set TENANT's weight in every lane's fair share (default 1)."""
    from core.errors import OmniJobsError

    try:
        _shares().set_weight(tenant, weight)
    except OmniJobsError as exc:
        raise typer.BadParameter(exc.message, param_hint="TENANT or WEIGHT") from None
    typer.echo(f"tenant {tenant}: weight {weight:g}")


@tenants_cli.command("list")
def tenants_list() -> None:
    """Every tenant and its weight."""
    typer.echo(f"{'tenant':<32} weight")
    for name, weight in sorted(_shares().weights().values()):
        typer.echo(f"{name:<32} {weight:g}")


@cli.command()
def workers(show_all: Annotated[bool, typer.Option(
        "--all", help="Also list processes whose heartbeat stopped (dead, not yet pruned)")
        ] = False) -> None:
    """List the fleet from the worker registry: every live worker and the maintenance
    process, with host, pid, pipelines, device, version, start, last heartbeat, job."""
    from datetime import UTC, datetime

    from storage.db import make_engine, make_sessionmaker
    from storage.repositories import WorkerRepository

    registry = WorkerRepository(make_sessionmaker(make_engine(_admin_db())))
    rows = registry.listed() if show_all else registry.live()
    now = datetime.now(UTC)
    typer.echo(f"{'role':<12} {'host':<20} {'pid':>7} {'state':<9} {'device':<10} "
               f"{'version':<9} {'started':<20} {'beat':>6} {'job':<36} pipelines")
    for w in rows:
        state = ("dead" if w.expires_at <= now else "draining" if w.draining_at else "live")
        beat = f"{(now - w.heartbeat_at).total_seconds():.0f}s"
        typer.echo(f"{w.role:<12} {w.host[:20]:<20} {w.pid:>7} {state:<9} "
                   f"{(w.device or '-')[:10]:<10} {w.version[:9]:<9} {_when(w.started_at):<20} "
                   f"{beat:>6} {w.job_id or '-':<36} {','.join(w.pipelines) or '-'}")
    if not rows:
        typer.echo("(no live workers)" if not show_all else "(the registry is empty)")


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _refuse_exposed_placeholder(settings: Settings, host: str) -> None:
    """The local store's URLs are signed with the signing secret: with the public
    placeholder, anyone who can reach the port could forge them."""
    if not _is_loopback(host) and (settings.signing_secret in PLACEHOLDER_SECRETS
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
def _metrics_folder() -> Iterator[Path]:
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


def _serve_summed(port: int, host: str, folder: Path) -> None:
    """The sum of every process's metrics in ``folder``, on ``port`` (a thread here)."""
    from prometheus_client import CollectorRegistry, start_http_server
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(folder))
    start_http_server(port, addr=host, registry=registry)


API_LOG_LEVEL = "OMNIJOBS_API_WORKER_LOG_LEVEL"  # handed to --workers' processes
Port = Annotated[int | None, typer.Option(
    help="Port to listen on", show_default="OMNIJOBS_PORT, else 8000")]


@cli.command()
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

    settings = _settings()
    port = settings.port if port is None else port
    _refuse_exposed_placeholder(settings, host)
    console.require_free_port(host, port)
    if metrics_port is not None:
        console.require_free_port(host, metrics_port, "--metrics-port")
    _logging(log_level)
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
    with _metrics_folder() as folder:  # before the processes start: they inherit it
        if metrics_port is not None:
            _serve_summed(metrics_port, host, folder)
        os.environ[API_LOG_LEVEL] = log_level
        uvicorn.run("omnijobs.cli:api_worker_app", factory=True, workers=workers, host=host,
                    port=port, log_level=log_level.lower(), log_config=None, access_log=False)


def api_worker_app():
    """The app of one ``omnijobs api --workers N`` process (uvicorn starts each afresh:
    settings from the environment, logging as the parent's)."""
    from api.app import quiet_collector

    _logging(os.environ.get(API_LOG_LEVEL, "info"))
    app = build_api(_settings())
    quiet_collector()
    return app


@cli.command()
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
        raise typer.Exit(_supervised(metrics_port))
    _run_worker(pipeline, metrics_port, log_level.upper())


def _supervised(metrics_port: int | None) -> int:
    """The supervisor; with ``metrics_port``, it serves the sum of this and every later
    child's metrics (a fresh child does not start its counters over)."""
    args = [*_without_option(sys.argv[1:], "--metrics-port"), "--no-supervise"]
    if metrics_port is None:
        return _supervise(args)
    console.require_free_port("0.0.0.0", metrics_port, "--metrics-port")
    with _metrics_folder() as folder:
        _serve_summed(metrics_port, "0.0.0.0", folder)
        return _supervise(args, folder)


def _without_option(args: list[str], name: str) -> list[str]:
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


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: the worker gets SIGKILL if its supervisor dies, so none is orphaned."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _supervise(args: list[str], metrics: Path | None = None) -> int:
    from tasks.runtime import RESTART_EXIT

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
                                 preexec_fn=_die_with_parent, process_group=0)
        code = child.wait()
        if metrics is not None:  # its live gauges go; its counters stay in the sum
            from prometheus_client.multiprocess import mark_process_dead

            mark_process_dead(child.pid, path=str(metrics))
        if code != RESTART_EXIT or stopping:
            return code
        log.warning("worker exited for a restart; starting a fresh one")


def _run_worker(pipeline: list[str] | None, metrics_port: int | None, loglevel: str) -> None:
    from pipelines import get_spec, served_pipelines
    from tasks.app import make_celery
    from tasks.runtime import RESTART_EXIT, get_runtime

    _logging(loglevel)
    settings = _settings()
    runtime = get_runtime(settings)  # registers the pipeline modules
    names = served_pipelines(pipeline, settings.pipelines)
    if metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(metrics_port)
    runtime.warm(names)  # a refusal here stays one line: the start-up line comes after
    startup.log_start(settings, "worker", names)
    queues = [get_spec(n).queue for n in names]
    argv = ["--quiet", "worker", "--pool=solo", "-Q", ",".join(queues),
            f"--loglevel={loglevel}",
            "-n", f"omnijobs-{os.getpid()}@%h", "--without-gossip", "--without-mingle", "-E"]
    try:
        make_celery(settings).worker_main(argv)
    finally:
        if runtime.restart_requested:
            os._exit(RESTART_EXIT)  # after Celery's warm shutdown drained in-flight work


@cli.command()
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
    _logging(log_level)
    settings = _settings()
    startup.log_start(settings, "maintenance")
    runtime = get_runtime(settings)
    runtime.check_line = line_checker(settings)  # batch lines: the API's own contract
    run(runtime, make_celery(settings), log_level.upper(), metrics_port=metrics_port)


@cli.command()
def beat(log_level: LogLevel = "INFO") -> None:
    """Same as ``omnijobs maintenance`` (its former name)."""
    maintenance(log_level, None)


def _drain_bound(settings: Settings) -> float:
    """How long a stopping worker may take: its drain bound and the hand-back after."""
    from pipelines import import_pipeline_modules
    from tasks.runtime import HAND_BACK_GRACE_S, max_runtime_s

    if settings.drain_s is not None:
        return settings.drain_s + HAND_BACK_GRACE_S
    import_pipeline_modules(settings.pipeline_modules)
    return max(max_runtime_s(settings, n) for n in settings.pipelines) + HAND_BACK_GRACE_S


def key_file(settings: Settings):
    """Where ``omnijobs dev`` keeps its API key (the README points there)."""
    return local.key_file(settings.home)


def _dev_key(settings: Settings) -> str:
    from storage.db import make_engine, make_sessionmaker
    from storage.repositories import KeyRepository

    keys = KeyRepository(make_sessionmaker(make_engine(settings.db_url)))
    path = key_file(settings)
    if path.exists() and keys.authenticate(path.read_text().strip()):
        return path.read_text().strip()
    _, key = keys.create_key("dev")
    path.write_text(key + "\n")
    path.chmod(0o600)
    return key


@cli.command()
def dev(host: str = "127.0.0.1", port: Port = None,
        allow_remote: Annotated[bool, typer.Option(
            help="Allow a non-loopback --host (needs OMNIJOBS_SIGNING_SECRET)")] = False
        ) -> None:
    """Embedded mode: SQLite, filesystem broker, local object store, worker, maintenance
    and API."""
    import uvicorn

    from storage.migrate import upgrade

    os.environ.setdefault("OMNIJOBS_LOG_FORMAT", "text")  # for a person (and the children)
    _logging()
    settings = _settings(create_home=False)
    port = settings.port if port is None else port
    if settings.mode != "embedded":
        raise typer.BadParameter("omnijobs dev runs the embedded mode only")
    if not _is_loopback(host) and not allow_remote:
        raise typer.BadParameter(f"omnijobs dev binds loopback only; {host} needs "
                                 "--allow-remote and a real signing secret",
                                 param_hint="--host")
    _refuse_exposed_placeholder(settings, host)
    console.require_free_port(host, port)  # before anything that looks like success
    os.environ.setdefault("OMNIJOBS_PUBLIC_BASE_URL", f"http://{host}:{port}")
    settings = _settings()
    startup.log_start(settings, "dev")
    upgrade(settings.db_url)
    key = _dev_key(settings)
    local.write_url(settings.home, f"http://{host}:{port}")  # for the client commands here
    # In process groups of their own: Ctrl-C reaches `omnijobs dev` alone, which passes
    # one SIGTERM on per Ctrl-C (the worker drains on the first, hands back on a second).
    children = [subprocess.Popen([sys.executable, "-m", "omnijobs.cli", role],
                                 preexec_fn=_die_with_parent, process_group=0)
                for role in ("worker", "maintenance")]
    drain_s = _drain_bound(settings)

    def stop_children() -> None:
        running = [child for child in children if child.poll() is None]
        for child in running:
            child.send_signal(signal.SIGTERM)
        if running:
            typer.echo(f"stopping: the worker finishes its job first (at most {drain_s:g}s; "
                       "Ctrl-C again hands it back to the queue now)", err=True)
        deadline = time.monotonic() + drain_s + 30
        for child in children:
            try:
                child.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()

    def stop_and_exit(*_args) -> None:
        stop_children()
        raise SystemExit(0)

    # uvicorn re-raises SIGINT/SIGTERM after its graceful shutdown; this handler then
    # stops the worker and maintenance too, so nothing outlives `omnijobs dev`.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop_and_exit)
    typer.echo(f"\nomnijobs is starting on http://{host}:{port}\nAPI key: {key}\n"
               f"(saved in {key_file(settings)}: KEY=$(cat {key_file(settings)}))\n\n"
               "Try:\n"
               f"  curl -sS http://{host}:{port}/v1/audio/speech \\\n"
               f"    -H 'Authorization: Bearer {key}' -H 'Content-Type: application/json' \\\n"
               "    -d '{\"model\": \"tts-1\", \"voice\": \"alloy\", \"response_format\": "
               "\"wav\", \"input\": \"Hello from omnijobs.\"}' \\\n"
               "    -o hello.wav\n")
    try:
        uvicorn.run(build_api(settings), host=host, port=port, log_level="info",
                    log_config=None, access_log=False)
    finally:  # without an exit of its own: a server that failed keeps its status
        stop_children()


def main() -> None:
    console.run(cli, sys.argv)


if __name__ == "__main__":
    main()
