"""``omnijobs dev``: the embedded mode in one command (SQLite, filesystem broker, local
store), with a worker and the maintenance process as children that stop with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Annotated

import typer

from core.settings import Settings

from . import console, local, startup
from .options import Port, load_settings, start_logging
from .serve_cli import build_api, is_loopback, refuse_exposed_placeholder
from .supervisor import die_with_parent


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


def dev(host: str = "127.0.0.1", port: Port = None,
        allow_remote: Annotated[bool, typer.Option(
            help="Allow a non-loopback --host (needs OMNIJOBS_SIGNING_SECRET)")] = False
        ) -> None:
    """Embedded mode: SQLite, filesystem broker, local object store, worker, maintenance
    and API."""
    import uvicorn

    from storage.migrate import upgrade

    os.environ.setdefault("OMNIJOBS_LOG_FORMAT", "text")  # for a person (and the children)
    start_logging()
    settings = load_settings(create_home=False)
    port = settings.port if port is None else port
    if settings.mode != "embedded":
        raise typer.BadParameter("omnijobs dev runs the embedded mode only")
    if not is_loopback(host) and not allow_remote:
        raise typer.BadParameter(f"omnijobs dev binds loopback only; {host} needs "
                                 "--allow-remote and a real signing secret",
                                 param_hint="--host")
    refuse_exposed_placeholder(settings, host)
    console.require_free_port(host, port)  # before anything that looks like success
    os.environ.setdefault("OMNIJOBS_PUBLIC_BASE_URL", f"http://{host}:{port}")
    settings = load_settings()
    startup.log_start(settings, "dev")
    upgrade(settings.db_url)
    key = _dev_key(settings)
    local.write_url(settings.home, f"http://{host}:{port}")  # for the client commands here
    # In process groups of their own: Ctrl-C reaches `omnijobs dev` alone, which passes
    # one SIGTERM on per Ctrl-C (the worker drains on the first, hands back on a second).
    children = [subprocess.Popen([sys.executable, "-m", "omnijobs.cli", role],
                                 preexec_fn=die_with_parent, process_group=0)
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
