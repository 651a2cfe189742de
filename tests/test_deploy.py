"""The production topology in docker-compose.yml is coherent with the code."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from typer.main import get_command

from core.settings import Settings
from omnijobs.cli import cli
from pipelines import get_spec, import_pipeline_modules

COMPOSE = yaml.safe_load((Path(__file__).resolve().parent.parent / "docker-compose.yml")
                         .read_text())
SERVICES = COMPOSE["services"]


def test_topology_has_every_role():
    assert {"api", "worker", "maintenance", "migrate", "redis", "postgres", "seaweedfs",
            "bucket-init", "gpu-worker"} <= set(SERVICES)


def test_maintenance_runs_once_and_apart_from_render_workers():
    """One maintenance process; render workers never take maintenance work, so a render
    backlog cannot hold up the relay or the reaper."""
    roles = {name: svc["command"][1] for name, svc in SERVICES.items()
             if isinstance(svc.get("command"), list) and svc["command"][0] == "omnijobs"}
    assert [n for n, cmd in roles.items() if cmd in ("maintenance", "beat")] == ["maintenance"]
    assert SERVICES["maintenance"].get("deploy", {}).get("replicas", 1) == 1
    for name, cmd in roles.items():
        if cmd == "worker":
            assert not {"--beat", "-B", "--maintenance"} & set(SERVICES[name]["command"])


def test_every_omnijobs_command_exists():
    commands = get_command(cli).commands
    for name, svc in SERVICES.items():
        cmd = svc.get("command")
        if isinstance(cmd, list) and cmd[0] == "omnijobs":
            assert cmd[1] in commands, (name, cmd)


def test_s3_store_refuses_anonymous_reads():
    assert "-s3.config=" in " ".join(SERVICES["seaweedfs"]["command"])


def test_gpu_worker_reserves_a_gpu_and_mounts_models():
    gpu = SERVICES["gpu-worker"]
    [device] = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert any(v.startswith("models:") for v in gpu["volumes"])
    assert "--gpu" in gpu["command"] and gpu["profiles"] == ["gpu"]


def test_production_services_run_in_production_mode():
    for name in ("api", "worker", "maintenance", "gpu-worker"):
        env = SERVICES[name]["environment"]
        assert env["OMNIJOBS_MODE"] == "production", name


def test_a_refused_secret_stops_every_omnijobs_service():
    """Compose cannot measure a variable's length; the one-shot migrate (production mode,
    so a signing secret under 16 characters is refused in one line, see test_cli) runs
    first and every omnijobs service waits for it to succeed."""
    assert SERVICES["migrate"]["environment"]["OMNIJOBS_MODE"] == "production"
    assert "16+ characters" in SERVICES["api"]["environment"]["OMNIJOBS_SIGNING_SECRET"]
    for name in ("api", "worker", "maintenance", "gpu-worker"):
        assert SERVICES[name]["depends_on"]["migrate"] == {
            "condition": "service_completed_successfully"}, name


def compose_default(value: str) -> str:
    """A compose value as it is without an .env: ``${VAR:-default}`` -> default."""
    match = re.fullmatch(r"\$\{[A-Z0-9_]+:-(.*)\}", value, re.S)
    return match.group(1) if match else value


def omnijobs_services() -> dict[str, dict]:
    return {name: svc for name, svc in SERVICES.items()
            if isinstance(svc.get("command"), list) and svc["command"][0] == "omnijobs"}


def served_by(command: list[str], enabled: list[str]) -> set[str]:
    """What ``omnijobs worker`` serves: its ``--pipeline``s, or every enabled one."""
    named = {command[i + 1] for i, arg in enumerate(command) if arg == "--pipeline"}
    return named or set(enabled)


def test_one_pipeline_list_for_the_api_and_every_worker():
    """The API accepts exactly what the workers serve: a worker's pipeline the API does
    not list is a 404 for its model; a listed pipeline no worker serves queues forever."""
    services = omnijobs_services()
    default = json.dumps(Settings.model_fields["pipelines"].default)
    lists = {name: compose_default(svc["environment"].get("OMNIJOBS_PIPELINES", default))
             for name, svc in services.items()}
    assert len(set(lists.values())) == 1, f"one OMNIJOBS_PIPELINES for every service: {lists}"
    enabled = json.loads(lists["api"])
    import_pipeline_modules()
    for name in enabled:
        get_spec(name)  # registered
    served: dict[str, set[str]] = {}
    for name, svc in services.items():
        if svc["command"][1] == "worker":
            for pipeline in served_by(svc["command"], enabled):
                served.setdefault(pipeline, set()).add(name)
    not_accepted = sorted(set(served) - set(enabled))
    assert not not_accepted, f"workers serve pipelines the API does not accept: {not_accepted}"
    unserved = sorted(set(enabled) - set(served))
    assert not unserved, f"the API accepts pipelines no worker serves: {unserved}"
