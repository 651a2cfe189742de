"""The production topology in docker-compose.yml is coherent with the code."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml
from typer.main import get_command

from core.errors import ConfigurationError
from core.settings import Settings
from omnijobs.cli import cli
from pipelines import get_spec, import_pipeline_modules
from pipelines.devices import gpus_needed
from pipelines.registry import get_pipeline_class

from .fake_omni import FakeOmni

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]


def test_topology_has_every_role():
    assert {"api", "worker", "maintenance", "migrate", "redis", "postgres", "seaweedfs",
            "gpu-worker-audex-tts", "gpu-worker-minimax-h3", "flower",
            "prometheus"} <= set(SERVICES)


def test_the_services_create_the_bucket_themselves():
    """OMNIJOBS_S3_CREATE_BUCKET (on by default) is the bucket step: no service of its
    own, and no omnijobs service turns it off."""
    assert not [n for n in SERVICES if "bucket" in n]
    for name, svc in omnijobs_services().items():
        assert svc["environment"].get("OMNIJOBS_S3_CREATE_BUCKET", "true") == "true", name
    assert Settings.model_fields["s3_create_bucket"].default is True


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


def test_s3_store_opens_no_iceberg_or_lance_port():
    """SeaweedFS 4.48 opens 8181 and 9101 (a worker's usual --metrics-port) by default."""
    args = " ".join(SERVICES["seaweedfs"]["command"]).split()
    assert {"-s3.port.iceberg=0", "-s3.port.lance=0"} <= set(args)


GPU_WORKERS = sorted(n for n in SERVICES if n.startswith("gpu-worker-"))


def gpu_options(svc: dict) -> dict:
    return json.loads(svc["environment"]["OMNIJOBS_PIPELINE_OPTIONS"])


def test_one_gpu_worker_per_pipeline_each_on_gpus_of_its_own():
    devices = []
    for name in GPU_WORKERS:
        gpu = SERVICES[name]
        [device] = gpu["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
        assert any(v.startswith("models:/models") for v in gpu["volumes"])
        assert gpu["profiles"] == ["gpu"]
        cmd = gpu["command"]
        assert cmd.count("--pipeline") == 1 and name == "gpu-worker-" + cmd[cmd.index(
            "--pipeline") + 1]
        devices += device["device_ids"]
        # The API and every worker read one list of pipelines.
        assert name.removeprefix("gpu-worker-") in json.loads(
            compose_default(gpu["environment"]["OMNIJOBS_PIPELINES"]))
    assert len(devices) == len(set(devices)) and len(GPU_WORKERS) >= 2


@pytest.mark.parametrize("name", GPU_WORKERS)
def test_a_gpu_worker_is_given_the_gpus_its_deploy_names_and_sees_them(name, monkeypatch):
    """The deploy config (read from vllm-omni's wheel) names the devices; the container
    is given exactly that many, numbered from 0 inside it, and the worker passes no
    --gpu (``--gpu 1`` in a container given one device left it none). The fake engine
    counts what the worker would see there, as CUDA does, and builds."""
    svc = SERVICES[name]
    [device] = svc["deploy"]["resources"]["reservations"]["devices"]
    cmd = svc["command"]
    pipeline = cmd[cmd.index("--pipeline") + 1]
    import_pipeline_modules()
    options = gpu_options(svc)[pipeline]
    deploy = get_pipeline_class(pipeline).deploy_config(options)
    assert len(device["device_ids"]) == gpus_needed(deploy), (deploy, device)
    assert "--gpu" not in cmd
    monkeypatch.setenv("FAKE_OMNI_GPUS", str(len(device["device_ids"])))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    FakeOmni(options["model"], deploy)


def test_a_container_given_one_gpu_and_told_gpu_1_sees_none(monkeypatch):
    """What the compose file shipped before: the H3 worker's one device was number 1."""
    monkeypatch.setenv("FAKE_OMNI_GPUS", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with pytest.raises(ConfigurationError, match=r"this process sees 0 \(CUDA_VISIBLE_DEV"):
        FakeOmni("/models/Nemotron-Labs-Audex-2B", "audex_tts.yaml")


def seconds(value: str) -> float:
    return float(value.removesuffix("s"))


def test_every_worker_may_drain_before_it_is_killed():
    """docker compose stop sends SIGTERM, then SIGKILL after stop_grace_period: that must
    outlast the drain and the hand-back after it."""
    from tasks.runtime import HAND_BACK_GRACE_S

    for name in ["worker", *GPU_WORKERS]:
        svc = SERVICES[name]
        drain = float(svc["environment"]["OMNIJOBS_DRAIN_S"])
        assert seconds(svc["stop_grace_period"]) > drain + HAND_BACK_GRACE_S, name


def test_flower_and_prometheus_listen_on_loopback_only():
    assert SERVICES["flower"]["command"][:3] == ["celery", "--broker=redis://redis:6379/0",
                                                 "flower"]
    for name in ("flower", "prometheus"):
        assert all(p.startswith("127.0.0.1:") for p in SERVICES[name]["ports"]), name


def test_prometheus_scrapes_every_metrics_port():
    [mount] = [v for v in SERVICES["prometheus"]["volumes"] if "prometheus.yml" in v]
    config = yaml.safe_load((ROOT / mount.split(":")[0]).read_text())
    targets = {t for job in config["scrape_configs"] for c in job["static_configs"]
               for t in c["targets"]}
    exporting = {f"{name}:{svc['command'][svc['command'].index('--metrics-port') + 1]}"
                 for name, svc in SERVICES.items()
                 if "--metrics-port" in (svc.get("command") or [])}
    assert targets == exporting and "maintenance:9100" in targets


def test_production_services_run_in_production_mode():
    for name in ("api", "worker", "maintenance", *GPU_WORKERS):
        env = SERVICES[name]["environment"]
        assert env["OMNIJOBS_MODE"] == "production", name


def test_a_refused_secret_stops_every_omnijobs_service():
    """Compose cannot measure a variable's length; the one-shot migrate (production mode,
    so a signing secret under 16 characters is refused in one line, see test_cli) runs
    first and every omnijobs service waits for it to succeed."""
    assert SERVICES["migrate"]["environment"]["OMNIJOBS_MODE"] == "production"
    assert "16+ characters" in SERVICES["api"]["environment"]["OMNIJOBS_SIGNING_SECRET"]
    for name in ("api", "worker", "maintenance", *GPU_WORKERS):
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


def test_the_audex_worker_waits_for_its_weights_to_be_prepared():
    """The GPU workers mount the models read-only, where the engine's first-start linking
    fails: the one-shot models-prepare service links the Audex worker's folder first."""
    prep = SERVICES["models-prepare"]
    worker = SERVICES["gpu-worker-audex-tts"]
    model = gpu_options(worker)["audex-tts"]["model"]
    assert prep["command"] == ["omnijobs", "models", "prepare", model]
    assert prep["restart"] == "no" and prep["profiles"] == ["gpu"]
    assert prep["volumes"] == ["models:/models"]
    assert worker["depends_on"]["models-prepare"] == {
        "condition": "service_completed_successfully"}
    assert {"postgres", "redis", "migrate"} <= set(worker["depends_on"])
    for name in GPU_WORKERS:
        assert SERVICES[name]["volumes"] == ["models:/models:ro"]


def read_only_mounts(svc: dict) -> list[str]:
    return [v.split(":")[1] for v in svc.get("volumes", []) if v.endswith(":ro")]


@pytest.mark.parametrize("name", GPU_WORKERS)
def test_what_every_engine_start_writes_is_off_the_read_only_models(name):
    """transformers writes the models' remote code (H3's VAEs, Audex's trust_remote_code
    stages) into HF_MODULES_CACHE, else $HF_HOME/modules, at every engine start."""
    env = SERVICES[name]["environment"]
    modules = env.get("HF_MODULES_CACHE") or os.path.join(env["HF_HOME"], "modules")
    mounts = read_only_mounts(SERVICES[name])
    assert mounts == ["/models"]
    assert not any(Path(modules).is_relative_to(m) for m in mounts), modules
    docker = (ROOT / "Dockerfile.gpu").read_text()
    assert f"HF_MODULES_CACHE={modules}" in docker  # the image's own default agrees
    assert Path(modules).is_relative_to("/var/lib/omnijobs")  # the folder uid 1000 owns
    assert "chown 1000 /var/lib/omnijobs" in docker


@pytest.mark.parametrize("name", GPU_WORKERS)
def test_gpu_workers_load_local_folders_and_never_ask_the_hub(name):
    env = SERVICES[name]["environment"]
    assert env["HF_HUB_OFFLINE"] == "1" and env["TRANSFORMERS_OFFLINE"] == "1"
    for options in gpu_options(SERVICES[name]).values():
        assert options["model"].startswith("/models/")
    assert "HF_HUB_OFFLINE=1" in (ROOT / "Dockerfile.gpu").read_text()
