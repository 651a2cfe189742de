"""The GPU boundary refuses what vLLM-Omni 0.30.0 refuses: an engine stack it was not
built for, engine arguments no config owns, a model path its stages cannot be found in.
The production factory and the fake engine apply the same rules, so the tests that run
on the fake would fail where a real deployment would."""

from __future__ import annotations

import sys

import pytest

from core.errors import ConfigurationError
from pipelines import omni_bridge
from pipelines.audex import AudexTTS
from pipelines.omni_bridge import (
    ENGINE_STACK,
    build_async_omni,
    check_engine_stack,
    check_torch_build,
)
from tests.fake_omni import FakeOmni, fake_stack, fake_torch

H3 = "minimax_h3_disaggregated.yaml"


def test_the_pinned_stack_passes_and_a_missing_one_is_left_to_the_import():
    check_engine_stack(dict(ENGINE_STACK))
    check_engine_stack({"vllm": "0.30.0+cu130", "vllm-omni": "0.30.0"})  # a CUDA build
    check_engine_stack({"vllm": None, "vllm-omni": None})  # gpu_import names the extra


@pytest.mark.parametrize("stack", [{"vllm": "0.33.0", "vllm-omni": "0.30.0"},
                                   {"vllm": "0.30.0", "vllm-omni": "0.26.0"}])
def test_a_mismatched_stack_is_refused_in_one_line(stack):
    with pytest.raises(ConfigurationError) as info:
        check_engine_stack(stack)
    message = str(info.value)
    wrong = next(f"{d} {v}" for d, v in stack.items() if v != ENGINE_STACK[d])
    assert wrong in message and "vllm==0.30.0 and vllm-omni==0.30.0" in message
    assert "\n" not in message and info.value.code == "engine_version_mismatch"


def test_the_production_factory_checks_before_it_imports_the_engine(monkeypatch):
    """A vllm that vllm-omni was not built for can break vllm_omni's own import."""
    monkeypatch.setattr(omni_bridge, "installed_stack",
                        lambda: {"vllm": "0.33.0", "vllm-omni": "0.30.0"})
    monkeypatch.delitem(sys.modules, "vllm_omni", raising=False)
    with pytest.raises(ConfigurationError, match="vllm 0.33.0"):
        build_async_omni("nvidia/Nemotron-Labs-Audex-2B", "audex_tts.yaml")
    assert "vllm_omni" not in sys.modules


def test_a_torch_without_cuda_is_refused_in_one_line_before_the_engine_is_imported(
        monkeypatch):
    """A CPU torch (what a CPU index offers for torch==2.13.0) installs and imports; vLLM
    would find no device only deep in the engine's start."""
    monkeypatch.setattr(omni_bridge, "installed_stack", lambda: dict(ENGINE_STACK))
    monkeypatch.setitem(sys.modules, "torch", fake_torch("2.13.0+cpu"))
    monkeypatch.delitem(sys.modules, "vllm_omni", raising=False)
    with pytest.raises(ConfigurationError) as info:
        build_async_omni("nvidia/Nemotron-Labs-Audex-2B", "audex_tts.yaml")
    message = str(info.value)
    assert info.value.code == "torch_without_cuda" and "\n" not in message
    assert "torch 2.13.0+cpu is built without CUDA" in message and "580" in message
    assert "vllm_omni" not in sys.modules


def test_a_cuda_12_torch_is_refused():
    """vllm 0.30.0's kernels link libcudart.so.13: a cu128 build imports, then fails."""
    with pytest.raises(ConfigurationError, match="torch 2.13.0[+]cu128 is built for CUDA 12.8"):
        check_torch_build(fake_torch("2.13.0+cu128"))


def test_a_cuda_torch_passes():
    check_torch_build(fake_torch())  # the fake's default: 2.13.0+cu130
    assert fake_torch().version.cuda == "13.0"


def test_the_fake_refuses_a_cpu_torch(monkeypatch):
    monkeypatch.setenv("FAKE_OMNI_TORCH", "2.13.0+cpu")
    with pytest.raises(ConfigurationError, match="built without CUDA"):
        FakeOmni("nvidia/Nemotron-Labs-Audex-2B", "audex_tts.yaml")


def test_the_fake_refuses_a_mismatched_stack(monkeypatch):
    assert fake_stack() == ENGINE_STACK  # what the tests run against, by default
    monkeypatch.setenv("FAKE_OMNI_VLLM_VERSION", "0.33.0")
    with pytest.raises(ConfigurationError, match="vllm 0.33.0"):
        FakeOmni("nvidia/Nemotron-Labs-Audex-2B", "audex_tts.yaml")
    with pytest.raises(ConfigurationError, match="vllm 0.33.0"):
        AudexTTS({"engine_factory": "tests.fake_omni:make_engine",
                  "tokenizer_factory": "tests.fake_omni:make_tokenizer"}).load()


@pytest.mark.parametrize(("deploy", "kwargs"), [
    ("audex_tts.yaml", {"gpu_memory_utilization": 0.5, "max_model_len": 8192,
                        "stage_0_enforce_eager": True, "init_timeout": 900}),
    (H3, {"stage_1_ulysses_degree": 4, "stage_0_tensor_parallel_size": 2,
          "enable_cpu_offload": True}),
])
def test_engine_arguments_with_an_owner_are_accepted(deploy, kwargs):
    assert FakeOmni("any/model", deploy, **kwargs).deploy_config == deploy


@pytest.mark.parametrize(("deploy", "kwargs", "refused"), [
    ("audex_tts.yaml", {"max_num_seq": 4}, "max_num_seq"),  # a typo does nothing: refused
    ("audex_tts.yaml", {"enable_cpu_offload": True}, "enable_cpu_offload"),  # diffusion only
    ("audex_tts.yaml", {"stage_2_max_model_len": 1}, "stage_2_max_model_len"),  # no stage 2
    (H3, {"stage_1_runner": "pooling"}, "stage_1_runner"),  # an LLM field on the DiT
])
def test_engine_arguments_without_an_owner_are_refused(deploy, kwargs, refused):
    with pytest.raises(ValueError, match=f"no structured config owner: {refused}$"):
        FakeOmni("any/model", deploy, **kwargs)


def test_removed_engine_arguments_say_what_replaced_them():
    with pytest.raises(TypeError, match="Use `max_num_seqs`"):
        FakeOmni("any/model", H3, diffusion_batch_size=2)


def test_a_checkpoint_folder_or_an_incomplete_checkout_is_refused(tmp_path):
    with pytest.raises(RuntimeError, match="Could not resolve the Audex repo"):
        FakeOmni(str(tmp_path / "gone" / "checkpoint_folder_audiogen"), "audex_tts.yaml")
    (tmp_path / "checkpoint_folder_audiogen").mkdir()
    with pytest.raises(RuntimeError, match=r"has no \['audex_causal_speech_decoder'\]"):
        FakeOmni(str(tmp_path), "audex_tts.yaml")
    (tmp_path / "audex_causal_speech_decoder").mkdir()
    assert FakeOmni(str(tmp_path), "audex_tts.yaml").model == str(tmp_path)
    assert FakeOmni(str(tmp_path), H3).model == str(tmp_path)  # H3's stages name no folder
