"""Audex through vLLM-Omni, against the fake engine with the real output shapes."""

from __future__ import annotations

import copy
import sys
import types

import pytest

from core.errors import ConfigurationError, InvalidRequest, JobCancelled
from core.jobs import JobStatus
from media.probe import probe_audio
from pipelines import RunContext, SpeechRequest, get_spec, import_pipeline_modules
from pipelines.audex import (
    CFG_FIELDS,
    CODEC_HOP,
    RVQ_CODEBOOK_SIZE,
    RVQ_CODEBOOKS,
    RVQ_CODEC_CAP,
    SAMPLE_RATE,
    TTA_DEFAULT_CFG,
    AudexTTA,
    AudexTTS,
    audio_pieces,
    detect_mode,
    load_tokenizer,
    prompt_module,
)
from tasks.render import run_job
from tests import omni_source as src
from tests.fake_omni import DEPLOYS, FakeAutoTokenizer, FakeOmni, FakeTokenizer

from ..tasks.test_render import app, outcome, rt, submit, tenant  # noqa: F401  (fixtures)

FAKE = {"engine_factory": "tests.fake_omni:make_engine",
        "tokenizer_factory": "tests.fake_omni:make_tokenizer"}

import_pipeline_modules()


def loaded(cls, **options):
    pipeline = cls({**FAKE, **options})
    pipeline.load()
    return pipeline


@pytest.mark.parametrize(("deploy", "mode"), [
    ("audex_tts.yaml", "tts"), ("audex_tts_30b.yaml", "tts"), ("audex_tta.yaml", "tta"),
    ("audex_tta_30b.yaml", "tta"), ("audex_s2s.yaml", "tts"),
    ("audex_thinker_only.yaml", "text")])
def test_mode_comes_from_the_stage_set(deploy, mode):
    engine = FakeOmni("any/model-name-tta", deploy)  # the name must not matter
    from pipelines.omni_bridge import stage_names

    assert stage_names(engine) == set(DEPLOYS[deploy])
    assert detect_mode(stage_names(engine)) == mode


def test_unknown_stage_set_is_refused():
    with pytest.raises(ConfigurationError):
        detect_mode({"encoder", "dit"})


@pytest.mark.parametrize(("cls", "deploy"), [(AudexTTS, "audex_tta.yaml"),
                                             (AudexTTA, "audex_tts.yaml"),
                                             (AudexTTS, "audex_thinker_only.yaml")])
def test_engine_that_is_not_what_the_pipeline_serves_refuses_to_start(cls, deploy):
    with pytest.raises(ConfigurationError, match="builds a"):
        loaded(cls, deploy_config=deploy)


def test_load_warms_up_with_one_real_request():
    pipeline = loaded(AudexTTS)
    engine = pipeline._bridge.engine
    assert len(engine.requests) == 1 and "Warm up." in engine.requests[0]["prompt"]["prompt"]


def test_prompt_is_primed_with_the_models_own_builder():
    pipeline = loaded(AudexTTS)
    list(pipeline.speech(SpeechRequest(input="Hello there, world."), RunContext("job_p")))
    prompt = pipeline._bridge.engine.requests[-1]["prompt"]["prompt"]
    assert prompt == prompt_module().build_cond_prompt("Hello there, world.")
    assert prompt.endswith("<think></think><speechgen_start>")
    tta = loaded(AudexTTA)
    list(tta.speech(SpeechRequest(input="Rain on a tin roof."), RunContext("job_q")))
    assert tta._bridge.engine.requests[-1]["prompt"]["prompt"].endswith("<audiogen_start>")


def stage0(pipeline):
    return pipeline._bridge.engine.requests[-1]["params"][0]


def run(pipeline, text="Speak these words now.", **extra):
    return list(pipeline.speech(SpeechRequest(input=text, extra=extra), RunContext("job_x")))


def test_tts_is_unguided_by_default():
    pipeline = loaded(AudexTTS)
    run(pipeline)
    params = stage0(pipeline)
    assert not {"cfg_scale", "cfg_role", "cfg_pair_id", "cfg_null_prompt"} & set(
        params.extra_args)
    assert params.temperature == 0.1 and "tta_rvq" not in params.extra_args


def test_tts_guidance_sets_the_pair_and_the_guided_temperature():
    pipeline = loaded(AudexTTS)
    run(pipeline, cfg_scale=1.5)
    params, request = stage0(pipeline), pipeline._bridge.engine.requests[-1]
    extra = params.extra_args
    assert extra["cfg_scale"] == 1.5 and extra["cfg_role"] == "cond"
    assert extra["cfg_pair_id"] == request["request_id"]
    assert request["request_id"].startswith("job_x-")
    null = extra["cfg_null_prompt"]
    assert "<unk>" in null and "Speak" not in null
    tok = FakeTokenizer()
    assert len(tok.encode(null)) == len(tok.encode(request["prompt"]["prompt"]))
    assert params.temperature == 0.05


def test_tta_defaults_to_cfg_3_and_always_masks_rvq():
    pipeline = loaded(AudexTTA)
    run(pipeline, "Thunder rolling over hills.")
    extra = stage0(pipeline).extra_args
    assert extra["cfg_scale"] == 3.0 and extra["cfg_role"] == "cond"
    rvq = extra["tta_rvq"]
    assert [len(p) for p in rvq["phase_token_ids"]] == [1024] * 4
    assert rvq["phase_token_ids"][1][0] == 196613 + 1024 and rvq["codec_cap"] == 4000
    assert stage0(pipeline).temperature == 1.0  # TTA keeps its sampling temperature
    run(pipeline, "Thunder again.", cfg_scale=1.0)
    assert "cfg_role" not in stage0(pipeline).extra_args
    assert "tta_rvq" in stage0(pipeline).extra_args


def test_engine_defaults_are_never_mutated():
    pipeline = loaded(AudexTTS)
    engine = pipeline._bridge.engine
    before = copy.deepcopy(engine.default_sampling_params_list)
    run(pipeline, cfg_scale=2.0)
    run(pipeline, " ".join(["long"] * 150))
    assert engine.default_sampling_params_list == before
    assert before[0].max_tokens == 2048 and before[0].extra_args is None  # audex_tts.yaml:59
    assert "cfg_role" not in stage0(pipeline).extra_args  # no leak from the guided job


def test_every_stage_asks_for_delta_output():
    """vLLM-Omni's speech server streams with DELTA on every stage (entrypoints/utils.py:
    342-356); CUMULATIVE re-concatenates the whole waveform at each step."""
    pipeline = loaded(AudexTTS)
    engine = pipeline._bridge.engine
    engine.emitted_samples = 0
    pieces = run(pipeline, "One two three four five six seven eight nine ten.")
    assert [p.output_kind for p in engine.requests[-1]["params"]] == ["DELTA", "DELTA"]
    samples = sum(len(p.samples) for p in pieces)
    assert samples == 0.25 * 10 * 16000
    assert engine.emitted_samples == samples  # each sample sent once, no snapshot copies


def test_constants_match_vllm_omni():
    adapter = src.constants("entrypoints/openai/tts_adapters/audex.py")
    tta_adapter = src.constants("entrypoints/openai/tts_adapters/audex_tta.py")
    tta = src.constants("model_executor/models/audex/tta.py")
    assert get_spec("audex-tts").numeric_fields == (
        ("cfg_scale", adapter["AUDEX_CFG_SCALE_MIN"], adapter["AUDEX_CFG_SCALE_MAX"]),)
    assert CFG_FIELDS == set(tta_adapter["_INTERNAL_KEYS"])
    assert TTA_DEFAULT_CFG == tta_adapter["AUDEX_TTA_DEFAULT_CFG_SCALE"]
    assert (RVQ_CODEBOOKS, RVQ_CODEBOOK_SIZE) == (tta["XCODEC1_NUM_CODEBOOKS"],
                                                  tta["XCODEC1_CODEBOOK_SIZE"])
    assert RVQ_CODEC_CAP == 4000  # audex_tta.py:139 writes it inline
    for deploy in ("audex_tts.yaml", "audex_tts_30b.yaml"):
        assert src.deploy(deploy)["stages"][0]["max_model_len"] == AudexTTS.context_tokens
    decoder = src.defaults("model_executor/models/audex/speech_decoder/"
                           "configuration_audex_causal_speech_decoder.py",
                           "AudexCausalSpeechDecoderConfig")
    assert (decoder["sample_rate"], decoder["hop_length"]) == (SAMPLE_RATE, CODEC_HOP)


@pytest.mark.parametrize(("fields", "param", "code"), [
    ({"voice": "alloy"}, "voice", "unsupported_voice"),
    ({"ref_audio": "data:audio/wav;base64,AAAA"}, "ref_audio", "unsupported_parameter"),
    ({"ref_text": "clone me"}, "ref_text", "unsupported_parameter"),
    ({"cfg_role": "uncond"}, "cfg_role", "reserved_parameter"),
    ({"cfg_pair_id": "x"}, "cfg_pair_id", "reserved_parameter"),
    ({"cfg_null_prompt": "x"}, "cfg_null_prompt", "reserved_parameter"),
    ({"tta_rvq": {}}, "tta_rvq", "reserved_parameter"),
    ({"cfg_scale": 0.5}, "cfg_scale", "invalid_request"),
    ({"cfg_scale": 10.5}, "cfg_scale", "invalid_request"),
    ({"cfg_scale": "high"}, "cfg_scale", "invalid_request"),
    ({"speed": 1.5}, "speed", "unsupported_parameter"),
])
@pytest.mark.parametrize("name", ["audex-tts", "audex-tta"])
def test_contract_rejections(name, fields, param, code):
    with pytest.raises(InvalidRequest) as err:
        get_spec(name).validate_speech(SpeechRequest.from_dict({"input": "hi", **fields}))
    assert err.value.param == param and err.value.code == code


def test_contract_accepts_default_voice_and_cfg_range():
    for fields in ({"voice": "default"}, {"voice": ""}, {"cfg_scale": 1.0},
                   {"cfg_scale": 10}):
        get_spec("audex-tts").validate_speech(SpeechRequest.from_dict({"input": "hi", **fields}))


def test_audio_shapes_from_the_engine():
    """A DELTA output holds the chunks decoded since the last one: a tensor, or a list of
    them not yet concatenated (outputs/mm_outputs.py:154-175); each is new audio."""
    import numpy as np

    sr_list = [np.array(16000, dtype="int32")]
    a = np.arange(10, dtype=np.float32)
    assert [len(p.samples) for p in audio_pieces({"audio": a, "sr": sr_list}, 0)] == [10]
    pieces = audio_pieces({"model_outputs": [a[:2], a, a[:0], a[:5]], "sr": 16000}, 0)
    assert [len(p.samples) for p in pieces] == [2, 10, 5]
    assert pieces[1].samples.tolist() == a.tolist() and pieces[1].sample_rate == 16000
    assert audio_pieces({}, 16000) == [] and audio_pieces({"text": "x"}, 16000) == []


def test_cancel_aborts_the_engine_request():
    pipeline = loaded(AudexTTS)
    calls = []

    def cancelled() -> bool:
        calls.append(1)
        return len(calls) > 1

    with pytest.raises(JobCancelled):
        list(pipeline.speech(SpeechRequest(input="[slow] a long sentence to speak"),
                             RunContext("job_c", is_cancelled=cancelled)))
    engine = pipeline._bridge.engine
    assert engine.aborted == [engine.requests[-1]["request_id"]]


# ---- through the real worker path -------------------------------------------------------

@pytest.fixture
def audex_rt(rt, tmp_path):  # noqa: F811
    rt.settings.pipelines = [*rt.settings.pipelines, "audex-tts", "audex-tta"]
    rt.settings.pipeline_options = {
        "audex-tts": {**FAKE, "engine_kwargs": {"die_marker": str(tmp_path / "died")}},
        "audex-tta": FAKE}
    return rt


def test_delta_chunks_aggregate_in_order(audex_rt, app, tenant):  # noqa: F811
    text = "One two three four five six seven eight."
    job = submit(audex_rt, tenant, "audex-tts", input=text, response_format="wav")
    assert outcome(run_job(audex_rt, app, job.id)) == "completed"
    [out] = audex_rt.jobs.get(job.id).outputs
    probe = probe_audio(audex_rt.store.get(out.key))
    assert probe.sample_rate == 16000 and probe.channels == 1
    assert out.duration_s == pytest.approx(0.25 * 8, abs=1e-3)  # every chunk, once


def test_long_text_gets_the_tokens_it_needs(audex_rt, app, tenant):  # noqa: F811
    """180 words speak for 45 s: 2250 codec frames, more than the yaml's max_tokens 2048."""
    text = " ".join(["go"] * 179) + " end."
    job = submit(audex_rt, tenant, "audex-tts", input=text, response_format="flac")
    assert outcome(run_job(audex_rt, app, job.id)) == "completed", audex_rt.jobs.get(job.id)
    assert audex_rt.jobs.get(job.id).outputs[0].duration_s == pytest.approx(45.0, abs=1e-3)
    engine = audex_rt.pipeline("audex-tts")._bridge.engine
    sent = engine.requests[-1]
    prompt_tokens = len(FakeTokenizer().encode(sent["prompt"]["prompt"]))
    assert 2250 <= sent["params"][0].max_tokens <= 4096 - prompt_tokens


def test_speech_cut_at_the_token_limit_fails_the_job(audex_rt, app, tenant):  # noqa: F811
    """A speaker slow enough to need more codec frames than the context leaves."""
    text = "[drawl] " + " ".join(["go"] * 100)
    job = submit(audex_rt, tenant, "audex-tts", input=text)
    assert outcome(run_job(audex_rt, app, job.id)) == "failed"
    failed = audex_rt.jobs.get(job.id)
    assert failed.error_code == "speech_truncated" and failed.outputs == ()
    assert failed.attempts == 1


class PairedUnkTokenizer(FakeTokenizer):
    """A tokenizer on which ``<unk>`` is two tokens: a text whose prompt is an odd number
    of tokens longer than the null template has no length-matched null prompt."""

    def encode(self, text: str) -> list[int]:
        return [t for t in super().encode(text) for _ in range(2 if t == self.unk else 1)]

    @property
    def unk(self) -> int:
        return super().encode("<unk>")[0]


def test_guidance_without_a_length_matched_null_prompt_is_refused_with_a_reason(
        audex_rt, app, tenant):  # noqa: F811
    """vLLM-Omni's builder raises when no ``<unk>`` count matches the prompt's length
    (model_executor/models/audex/prompt.py:56-67): the job fails, not retried, saying why
    and what to send instead, never as internal_error."""
    pipeline = audex_rt.pipeline("audex-tts")
    pipeline._tokenizer = PairedUnkTokenizer()
    job = submit(audex_rt, tenant, "audex-tts", input="One two three", cfg_scale=2.0)
    assert outcome(run_job(audex_rt, app, job.id)) == "failed"
    failed = audex_rt.jobs.get(job.id)
    assert (failed.error_code, failed.attempts) == ("cfg_unavailable", 1)
    assert "without cfg_scale" in failed.error_message
    assert "length-match" in failed.error_message  # the builder's own words


@pytest.mark.parametrize("name", ["audex-tts", "audex-tts-30b"])
def test_text_longer_than_the_context_allows_is_a_400(name):
    spec = get_spec(name)
    spec.validate_speech(SpeechRequest(input="x" * spec.max_input_chars))
    with pytest.raises(InvalidRequest) as err:
        spec.validate_speech(SpeechRequest(input="x" * (spec.max_input_chars + 1)))
    assert err.value.code == "input_too_long" and spec.max_input_chars < 1000


@pytest.fixture
def fake_transformers(monkeypatch):
    FakeAutoTokenizer.loaded.clear()
    monkeypatch.setitem(sys.modules, "transformers",
                        types.SimpleNamespace(AutoTokenizer=FakeAutoTokenizer))
    return FakeAutoTokenizer


def audex_checkout(root):
    """The Audex repository layout the engine joins its stage folders onto."""
    for sub in ("checkpoint_folder_audiogen", "checkpoint_folder_full",
                "audex_causal_speech_decoder"):
        (root / sub).mkdir(parents=True)
        (root / sub / "tokenizer_config.json").write_text("{}")
    return root


@pytest.mark.parametrize("folder", ["checkpoint_folder_audiogen", "checkpoint_folder_full"])
def test_tokenizer_loads_from_the_root(fake_transformers, tmp_path, folder):
    root = audex_checkout(tmp_path / "Nemotron-Labs-Audex-2B")
    assert load_tokenizer(str(root), folder).path == str(root / folder)


@pytest.mark.parametrize("given", ["checkpoint_folder_audiogen", "checkpoint_folder_full/"])
def test_a_checkpoint_folder_model_starts_from_its_repository_root(fake_transformers,
                                                                    tmp_path, given):
    """The engine joins each stage's folder onto the path it gets
    (engine/stage_init_utils.py:234-303), so a ``checkpoint_folder_*`` path would make it
    look for checkpoint_folder_full/checkpoint_folder_audiogen and refuse to start; the
    pipeline hands it (and the tokenizer) the repository root instead."""
    root = audex_checkout(tmp_path / "Nemotron-Labs-Audex-2B")
    with pytest.raises(RuntimeError, match="has no"):  # the engine, given the folder itself
        FakeOmni(str(root / "checkpoint_folder_full"), "audex_tts.yaml")
    pipeline = AudexTTS({"engine_factory": "tests.fake_omni:make_engine",
                         "model": str(root) + "/" + given})
    pipeline.load()
    assert pipeline._bridge.engine.model == str(root)
    assert pipeline._tokenizer.path == str(root / "checkpoint_folder_audiogen")


def test_speech_to_speech_deploy_uses_the_full_checkpoints_tokenizer():
    """``audex_omni`` stages read checkpoint_folder_full (tts_adapters/audex.py:50-52)."""
    assert loaded(AudexTTS, deploy_config="audex_s2s.yaml")._tokenizer.path.endswith(
        "::checkpoint_folder_full")
    assert loaded(AudexTTS)._tokenizer.path.endswith("::checkpoint_folder_audiogen")
    assert loaded(AudexTTA)._tokenizer.path.endswith("::checkpoint_folder_audiogen")


def test_model_outputs_key_is_read_too(audex_rt, app, tenant):  # noqa: F811
    job = submit(audex_rt, tenant, "audex-tts", input="[model_outputs] one two three four")
    assert outcome(run_job(audex_rt, app, job.id)) == "completed"


def test_zero_codec_tokens_fail_with_no_audio(audex_rt, app, tenant):  # noqa: F811
    job = submit(audex_rt, tenant, "audex-tts", input="[silent] nothing comes out")
    assert outcome(run_job(audex_rt, app, job.id)) == "failed"
    failed = audex_rt.jobs.get(job.id)
    assert failed.error_code == "no_audio" and "no audio generated" in failed.error_message


def test_tta_is_capped_at_ten_seconds(audex_rt, app, tenant):  # noqa: F811
    caption = " ".join(["waves"] * 60)
    job = submit(audex_rt, tenant, "audex-tta", input=caption)
    assert outcome(run_job(audex_rt, app, job.id)) == "completed"
    assert audex_rt.jobs.get(job.id).outputs[0].duration_s <= 10.01


def test_dead_engine_retries_the_job_and_asks_for_a_restart(audex_rt, app, tenant,  # noqa: F811
                                                            monkeypatch):
    restarts = []
    monkeypatch.setattr(audex_rt, "request_restart", lambda: restarts.append(1))
    job = submit(audex_rt, tenant, "audex-tts", input="[die] one two three")
    assert outcome(run_job(audex_rt, app, job.id)) == "retrying"
    queued = audex_rt.jobs.get(job.id)
    assert queued.status is JobStatus.QUEUED and queued.error_code == "engine_dead"
    assert restarts == [1]


def test_consumer_giving_up_aborts_the_engine_request():
    pipeline = loaded(AudexTTS)
    gen = pipeline.speech(SpeechRequest(input="[slow] one two three"), RunContext("job_g"))
    next(gen)
    gen.close()  # e.g. the aggregator rejected a chunk
    engine = pipeline._bridge.engine
    assert engine.aborted == [engine.requests[-1]["request_id"]]


def test_engine_side_abort_is_a_retryable_failure_not_a_cancel():
    from core.errors import PipelineFailed

    pipeline = loaded(AudexTTS)
    with pytest.raises(PipelineFailed) as err:
        run(pipeline, "[engine-abort] one two")
    assert err.value.retryable and not isinstance(err.value, JobCancelled)


def test_silent_engine_counts_as_dead_after_the_timeout():
    from core.errors import EngineDead

    pipeline = loaded(AudexTTS, request_timeout_s=0.6)
    with pytest.raises(EngineDead):
        run(pipeline, "[hang] one two")
    engine = pipeline._bridge.engine
    assert engine.aborted == [engine.requests[-1]["request_id"]]
