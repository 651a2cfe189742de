"""The production topology in docker-compose.yml is coherent with the code."""

from __future__ import annotations

from pathlib import Path

import yaml
from typer.main import get_command

from omnijobs.cli import cli

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
