"""The GPUs each shipped deploy config places its stages on, read from vllm-omni
0.30.0's own yamls, and the worker's refusal to build an engine on fewer."""

from __future__ import annotations

import pytest

from core.errors import ConfigurationError
from pipelines.devices import check_visible, deploy_folder, gpus_needed, stage_devices
from tests.fake_omni import FakeOmni, fake_visible_gpus

H3_DEPLOYS = ["minimax_h3_disaggregated.yaml", "minimax_h3_disaggregated_nixl.yaml",
              "minimax_h3_disaggregated_turbo.yaml",
              "minimax_h3_disaggregated_turbo_nixl.yaml"]
AUDEX_DEPLOYS = sorted(p.name for p in deploy_folder().glob("audex_*.yaml"))


@pytest.mark.parametrize("deploy", H3_DEPLOYS)
def test_every_h3_deploy_needs_six_gpus_its_nixl_overlays_included(deploy):
    """The _nixl files name no devices of their own: they inherit their base's."""
    assert stage_devices(deploy) == {0: (0, 1), 1: (2, 3, 4, 5)}
    assert gpus_needed(deploy) == 6


def test_every_audex_deploy_runs_on_one_gpu():
    assert len(AUDEX_DEPLOYS) == 8
    assert {d: gpus_needed(d) for d in AUDEX_DEPLOYS} == dict.fromkeys(AUDEX_DEPLOYS, 1)


def test_a_worker_that_sees_too_few_gpus_is_refused_in_one_line():
    check_visible("minimax_h3_disaggregated.yaml", 6, "2,3,4,5,6,7")
    with pytest.raises(ConfigurationError) as info:
        check_visible("minimax_h3_disaggregated.yaml", 1, "1")
    message = str(info.value)
    assert info.value.code == "too_few_gpus" and "\n" not in message
    assert "6 GPU(s)" in message and "sees 1 (CUDA_VISIBLE_DEVICES=1)" in message
    assert "pass no --gpu" in message


def test_an_unknown_deploy_config_is_a_configuration_error():
    with pytest.raises(ConfigurationError, match="neither a file nor"):
        gpus_needed("no_such_deploy.yaml")


@pytest.mark.parametrize(("physical", "listed", "seen"), [
    ("8", None, 8), ("8", "2,3,4,5,6,7", 6), ("1", "1", 0), ("1", "0", 1),
    ("4", "0,9,1", 1),  # CUDA stops at the first ordinal that names no device
])
def test_the_fake_counts_visible_gpus_as_cuda_does(monkeypatch, physical, listed, seen):
    monkeypatch.setenv("FAKE_OMNI_GPUS", physical)
    if listed is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", listed)
    assert fake_visible_gpus() == seen


def test_the_fake_refuses_an_h3_engine_on_one_gpu(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(ConfigurationError, match="places its stages on 6 GPU"):
        FakeOmni("MiniMaxAI/MiniMax-H3", "minimax_h3_disaggregated.yaml")


def test_the_gpu_smoke_check_gives_each_worker_the_gpus_its_deploy_names(monkeypatch):
    from bench import gpu_smoke

    monkeypatch.setattr("sys.argv", ["gpu_smoke"])
    args = gpu_smoke.parse_args()
    for deploy in (args.tts_deploy, args.tta_deploy):
        assert len(args.gpu.split(",")) == gpus_needed(deploy)
    assert len(set(args.t2va_gpus.split(","))) == gpus_needed(args.t2va_deploy)
