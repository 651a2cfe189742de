"""deploy/kubernetes/: every core manifest valid against the Kubernetes schemas
(``kubernetes-validate``, offline, strict: an unknown field is an error), the KEDA objects
against KEDA's own CRD schema (kept in tests/kubernetes/keda/, strict the same way), and
the pieces coherent with each other and with the code: probes, one maintenance process,
a GPU worker per pipeline whose grace outlasts its drain, a scaler for each on the
fleet's gauges."""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from pydantic import ValidationError

from core.settings import Settings
from pipelines import import_pipeline_modules
from pipelines.devices import gpus_needed
from pipelines.registry import get_pipeline_class
from tasks.runtime import HAND_BACK_GRACE_S

from ..fake_omni import stage_max_num_seqs

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
CRDS = Path(__file__).resolve().parent / "keda"
K8S_VERSION = "1.30.0"


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


FILES = sorted(p for p in DEPLOY.rglob("*.yaml") if p.name != "kustomization.yaml")
DOCS = [(p, d) for p in FILES for d in documents(p)]
CORE = [(p, d) for p, d in DOCS if not d["apiVersion"].startswith("keda.sh/")]
KEDA = [(p, d) for p, d in DOCS if d["apiVersion"].startswith("keda.sh/")]
CONFIG = next(d for _, d in CORE if d["kind"] == "ConfigMap")["data"]


def named(kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for _, d in CORE if d["kind"] == kind}


DEPLOYMENTS = named("Deployment")
GPU_WORKERS = {n: d for n, d in DEPLOYMENTS.items()
               if d["metadata"]["labels"]["app.kubernetes.io/component"] == "gpu-worker"}


def container(deployment: dict) -> dict:
    [c] = deployment["spec"]["template"]["spec"]["containers"]
    return c


def pipelines_of(deployment: dict) -> list[str]:
    cmd = container(deployment)["command"]
    return [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--pipeline"]


def env_of(deployment: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container(deployment).get("env", [])}


@pytest.mark.parametrize("path,doc", CORE, ids=[f"{p.name}:{d['kind']}:{d['metadata']['name']}"
                                                for p, d in CORE])
def test_core_manifests_are_valid_kubernetes(path, doc):
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def crd_schema(kind: str) -> dict:
    [crd] = [d for p in CRDS.glob("*.yaml") for d in documents(p)
             if d["spec"]["names"]["kind"] == kind]
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    return version["schema"]["openAPIV3Schema"]


def unknown_fields(value, schema: dict, where: str = "") -> list[str]:
    """Fields the schema does not declare (the API server would drop them silently)."""
    if isinstance(value, dict) and "properties" in schema:
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            return []
        found = []
        for key, item in value.items():
            if key not in schema["properties"]:
                if "additionalProperties" not in schema:
                    found.append(f"{where}.{key}")
                continue
            found += unknown_fields(item, schema["properties"][key], f"{where}.{key}")
        return found
    if isinstance(value, list) and "items" in schema:
        return [f for i, item in enumerate(value)
                for f in unknown_fields(item, schema["items"], f"{where}[{i}]")]
    return []


@pytest.mark.parametrize("path,doc", KEDA, ids=[f"{p.parent.name}/{p.name}:{d['kind']}"
                                                for p, d in KEDA])
def test_keda_objects_match_kedas_crd_schema(path, doc):
    schema = crd_schema(doc["kind"])
    jsonschema.Draft7Validator(schema).validate(doc)
    assert unknown_fields(doc, schema) == []


def test_the_strict_checks_catch_a_misspelt_field():
    """Both checks would fail a typo, so their passing above means something."""
    deployment = json.loads(json.dumps(DEPLOYMENTS["omnijobs-api"]))
    deployment["spec"]["replica"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)
    [(_, scaled)] = [(p, d) for p, d in KEDA if p.parent.name == "prometheus"
                     and d["metadata"]["name"] == "omnijobs-worker-audex-tts"]
    scaled = json.loads(json.dumps(scaled))
    scaled["spec"]["minReplicas"] = 0
    assert unknown_fields(scaled, crd_schema("ScaledObject")) == [".spec.minReplicas"]
    scaled["spec"]["triggers"][0]["metadata"]["threshold"] = 1  # must be a string
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(crd_schema("ScaledObject")).validate(scaled)


def test_kustomization_names_every_core_manifest_and_the_prometheus_scalers():
    listed = set(yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["resources"])
    want = {str(p.relative_to(DEPLOY)) for p in FILES if "postgresql" not in p.parts}
    assert listed == want


def test_the_api_is_probed_on_readyz_and_healthz():
    api = container(DEPLOYMENTS["omnijobs-api"])
    assert api["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert api["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert {"--workers", "--metrics-port"} <= set(api["command"])


def test_maintenance_runs_once_and_serves_the_fleet_gauges():
    maintenance = DEPLOYMENTS["omnijobs-maintenance"]
    assert maintenance["spec"]["replicas"] == 1
    assert maintenance["spec"]["strategy"]["type"] == "Recreate"  # never two in a rollout
    assert container(maintenance)["command"][:2] == ["omnijobs", "maintenance"]
    assert "--metrics-port" in container(maintenance)["command"]
    others = [n for n, d in DEPLOYMENTS.items() if container(d)["command"][1] == "maintenance"]
    assert others == ["omnijobs-maintenance"]


def test_every_enabled_pipeline_has_a_worker_and_each_gpu_one_a_deployment():
    enabled = json.loads(CONFIG["OMNIJOBS_PIPELINES"])
    served = [p for d in DEPLOYMENTS.values() if container(d)["command"][1] == "worker"
              for p in pipelines_of(d)]
    assert sorted(served) == sorted(enabled)
    assert sorted(p for d in GPU_WORKERS.values() for p in pipelines_of(d)) == \
        ["audex-tts", "minimax-h3"]
    assert all(len(pipelines_of(d)) == 1 for d in GPU_WORKERS.values())


@pytest.mark.parametrize("name", sorted(GPU_WORKERS))
def test_a_gpu_worker_has_the_gpus_its_deploy_names_and_a_grace_above_its_drain(name):
    """The device plugin numbers a pod's GPUs from 0, which is what a deploy's stage
    ``devices`` count in: the pod asks for as many as its deploy (read from vllm-omni's
    wheel) names, and the worker passes no --gpu."""
    deployment = GPU_WORKERS[name]
    [pipeline] = pipelines_of(deployment)
    import_pipeline_modules()
    options = json.loads(CONFIG["OMNIJOBS_PIPELINE_OPTIONS"]).get(pipeline, {})
    needed = gpus_needed(get_pipeline_class(pipeline).deploy_config(options))
    resources = container(deployment)["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == resources["requests"]["nvidia.com/gpu"] \
        == needed
    assert "--gpu" not in container(deployment)["command"]
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > float(env_of(deployment)["OMNIJOBS_DRAIN_S"]) + HAND_BACK_GRACE_S


@pytest.mark.parametrize("name", sorted(GPU_WORKERS))
@pytest.mark.parametrize("scaler", ["prometheus", "postgresql"])
def test_each_gpu_worker_scales_from_zero_on_its_queue(name, scaler):
    [pipeline] = pipelines_of(GPU_WORKERS[name])
    [scaled] = [d for p, d in KEDA if p.parent.name == scaler and d["kind"] == "ScaledObject"
                and d["spec"]["scaleTargetRef"]["name"] == name]
    assert scaled["spec"]["minReplicaCount"] == 0 and scaled["spec"]["maxReplicaCount"] >= 1
    queries = [t["metadata"]["query"] for t in scaled["spec"]["triggers"]]
    assert all(t["type"] == scaler for t in scaled["spec"]["triggers"])
    if scaler == "prometheus":
        assert f'omnijobs_queue_depth{{pipeline="{pipeline}"}}' in queries[0]
        assert f'omnijobs_queue_oldest_age_seconds{{pipeline="{pipeline}"}}' in queries[1]
    else:
        assert all(f"pipeline = '{pipeline}'" in q for q in queries)
        refs = {t["authenticationRef"]["name"] for t in scaled["spec"]["triggers"]}
        assert refs == {d["metadata"]["name"] for _, d in KEDA
                        if d["kind"] == "TriggerAuthentication"}


def slots_per_worker(pipeline: str) -> int:
    """The slots a worker of ``pipeline`` computes from the shipped ConfigMap
    (pipelines/audex.py, base.py): the option ``slots``, else the smallest
    ``max_num_seqs`` of the stages of its vLLM-Omni deploy config (the released wheel's
    yaml, under any engine argument), else one."""
    options = json.loads(CONFIG["OMNIJOBS_PIPELINE_OPTIONS"]).get(pipeline, {})
    if "slots" in options:
        return int(options["slots"])
    if deploy := options.get("deploy_config"):
        return min(stage_max_num_seqs(deploy, options.get("engine_kwargs", {})))
    return 1


@pytest.mark.parametrize("name", sorted(GPU_WORKERS))
@pytest.mark.parametrize("scaler", ["prometheus", "postgresql"])
def test_each_scaler_divides_the_jobs_by_the_slots_per_worker(name, scaler):
    """A target of one pod per ``slots`` jobs: the autoscaler asks for ceil(jobs / target)
    pods, so 16 queued Audex jobs (8 slots a worker) ask for 2 workers, not 16."""
    [pipeline] = pipelines_of(GPU_WORKERS[name])
    [scaled] = [d for p, d in KEDA if p.parent.name == scaler and d["kind"] == "ScaledObject"
                and d["spec"]["scaleTargetRef"]["name"] == name]
    jobs = next(t for t in scaled["spec"]["triggers"] if t["name"] == "jobs")
    target = int(jobs["metadata"]["threshold" if scaler == "prometheus" else "targetQueryValue"])
    slots = slots_per_worker(pipeline)
    assert target == slots
    if pipeline == "audex-tts":
        assert slots == 8 and math.ceil(16 / target) == 2


def test_services_and_budgets_select_pods_that_exist():
    pods = [d["spec"]["template"]["metadata"]["labels"] for d in DEPLOYMENTS.values()]
    for kind, key in (("Service", ("selector",)), ("PodDisruptionBudget",
                                                   ("selector", "matchLabels"))):
        for name, doc in named(kind).items():
            selector = doc["spec"]
            for k in key:
                selector = selector[k]
            assert any(selector.items() <= labels.items() for labels in pods), name


def test_the_config_is_read_whole_and_the_secret_template_refused(monkeypatch):
    """The ConfigMap's values parse as the settings they name; with the Secret's
    placeholders the service refuses to start, so a forgotten one fails loudly."""
    secret = next(d for _, d in CORE if d["kind"] == "Secret")["stringData"]
    for key, value in {**CONFIG, **secret}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ValidationError, match="OMNIJOBS_SIGNING_SECRET"):
        Settings()
    monkeypatch.setenv("OMNIJOBS_SIGNING_SECRET", "a-real-signing-secret-0123")
    monkeypatch.setenv("OMNIJOBS_S3_SECRET_ACCESS_KEY", "a-real-secret-access-key")
    settings = Settings()
    assert settings.pipelines == json.loads(CONFIG["OMNIJOBS_PIPELINES"])
    assert set(settings.pipeline_options) == {"audex-tts", "minimax-h3"}
    assert all("change-me" in v for k, v in secret.items() if "SECRET" in k or "KEY" in k)


def test_commands_parse_as_the_cli_defines_them():
    from typer.main import get_command

    from omnijobs.cli import cli

    commands = get_command(cli).commands
    for name, deployment in {**DEPLOYMENTS, **named("Job")}.items():
        cmd = container(deployment)["command"]
        assert cmd[0] == "omnijobs" and cmd[1] in commands, (name, shlex.join(cmd))
        options = {o for p in commands[cmd[1]].params for o in p.opts}
        assert {a for a in cmd[2:] if a.startswith("--")} <= options, name


def test_the_models_prepare_job_links_the_folder_the_read_only_workers_load():
    """The Audex workers mount the weights read-only, where the engine's first-start
    linking fails: the Job prepares the very folder the ConfigMap points them at, on the
    same claim, mounted writable."""
    [job] = [d for _, d in CORE if d["kind"] == "Job"
             and d["metadata"]["name"] == "omnijobs-models-prepare"]
    pod = job["spec"]["template"]["spec"]
    [prep] = pod["containers"]
    options = json.loads(CONFIG["OMNIJOBS_PIPELINE_OPTIONS"])
    assert prep["command"] == ["omnijobs", "models", "prepare", options["audex-tts"]["model"]]
    [mount] = prep["volumeMounts"]
    assert not mount.get("readOnly") and mount["mountPath"] == "/models"
    claims = {v["name"]: v["persistentVolumeClaim"] for v in pod["volumes"]}
    assert claims[mount["name"]] == {"claimName": "omnijobs-models"}
    worker = GPU_WORKERS["omnijobs-worker-audex-tts"]
    [models] = [m for m in container(worker)["volumeMounts"] if m["mountPath"] == "/models"]
    assert models["readOnly"] is True
    [pvc] = [d for _, d in CORE if d["kind"] == "PersistentVolumeClaim"]
    assert {"ReadOnlyMany", "ReadWriteOnce"} <= set(pvc["spec"]["accessModes"])


@pytest.mark.parametrize("name", sorted(GPU_WORKERS))
def test_what_every_engine_start_writes_is_off_the_read_only_models(name):
    """transformers writes remote code into HF_MODULES_CACHE (else $HF_HOME/modules) at
    every engine start: never under a read-only mount."""
    modules = CONFIG.get("HF_MODULES_CACHE") or f"{CONFIG['HF_HOME']}/modules"
    read_only = [m["mountPath"] for m in container(GPU_WORKERS[name])["volumeMounts"]
                 if m.get("readOnly")]
    assert read_only == ["/models"]
    assert not any(Path(modules).is_relative_to(m) for m in read_only), modules


def test_gpu_workers_load_local_folders_and_never_ask_the_hub():
    assert CONFIG["HF_HUB_OFFLINE"] == "1" and CONFIG["TRANSFORMERS_OFFLINE"] == "1"
    for pipeline in ("audex-tts", "minimax-h3"):
        options = json.loads(CONFIG["OMNIJOBS_PIPELINE_OPTIONS"])[pipeline]
        assert options["model"].startswith("/models/")
