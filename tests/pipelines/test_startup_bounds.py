"""Each GPU pipeline gives its engine start-up bounds that fit its model (vLLM-Omni's
defaults, 600 s for the engine and 300 s per stage, are short for a cold 30B load or a
six-GPU H3 load with CUDA-graph capture), and the options override them."""

from __future__ import annotations

import pytest

from core.errors import EngineStartTimeout
from pipelines.audex import AudexTTS
from pipelines.omni_bridge import OmniBridge, startup_kwargs
from pipelines.t2va import MiniMaxH3
from tests import fake_omni

FAKE = {"engine_factory": "tests.fake_omni:make_engine",
        "tokenizer_factory": "tests.fake_omni:make_tokenizer"}


def test_the_options_override_the_pipelines_bounds_and_engine_kwargs_stay():
    assert startup_kwargs({}, 1800, 900) == {"init_timeout": 1800, "stage_init_timeout": 900}
    assert startup_kwargs({"engine_kwargs": {"max_model_len": 8192, "init_timeout": 700}},
                          1800, 900) == {"max_model_len": 8192, "init_timeout": 700,
                                         "stage_init_timeout": 900}
    assert startup_kwargs({"init_timeout_s": 4000, "stage_init_timeout_s": 2000,
                           "engine_kwargs": {"init_timeout": 700}}, 1800, 900) == {
        "init_timeout": 4000, "stage_init_timeout": 2000}


@pytest.mark.parametrize(("pipeline", "options", "bounds"), [
    (AudexTTS, {}, (1800, 900)),
    (MiniMaxH3, {}, (3600, 1800)),
    (AudexTTS, {"init_timeout_s": 2400, "stage_init_timeout_s": 1200}, (2400, 1200)),
])
def test_each_engine_is_built_with_its_pipelines_bounds(pipeline, options, bounds):
    pipeline({**FAKE, **options}).load()
    engine = fake_omni.ENGINES[-1]
    assert (engine.init_timeout, engine.stage_init_timeout) == bounds
    assert bounds[0] > fake_omni.INIT_TIMEOUT_S and bounds[1] > fake_omni.STAGE_INIT_TIMEOUT_S


def test_an_engine_not_ready_in_time_is_a_start_timeout():
    def factory():
        return fake_omni.make_engine("any/model", "audex_tts.yaml", init_timeout=60,
                                     load_s=61)
    with pytest.raises(EngineStartTimeout, match="within 60s.*init_timeout_s"):
        OmniBridge(factory)


def test_a_stage_timeout_wrapped_by_the_orchestrator_is_a_start_timeout_too():
    """vLLM-Omni wraps a stage's failure (vLLM's own engine-ready TimeoutError among
    them) in a RuntimeError (omni_engine_base.py:473-477)."""
    def factory():
        try:
            raise TimeoutError("Timed out waiting for engine core processes to start")
        except TimeoutError as exc:
            raise RuntimeError("Orchestrator initialization failed") from exc
    with pytest.raises(EngineStartTimeout, match="Timed out waiting for engine core"):
        OmniBridge(factory)


def test_another_start_failure_is_left_as_it_is():
    def factory():
        raise RuntimeError("CUDA out of memory")
    with pytest.raises(RuntimeError, match="out of memory"):
        OmniBridge(factory)


def test_a_crash_in_a_polls_timeout_handler_is_no_start_timeout():
    """vLLM-Omni raises "Orchestrator thread died during startup" inside the handler of
    its poll's bare TimeoutError (omni_engine_base.py:534-539): a crash, not a bound."""
    def factory():
        try:
            raise TimeoutError()
        except TimeoutError:
            raise RuntimeError("Orchestrator thread died during startup") from None
    with pytest.raises(RuntimeError, match="thread died"):
        OmniBridge(factory)
