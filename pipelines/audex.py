"""NVIDIA Nemotron Audex (TTS and TTA) served through vLLM-Omni.

Options (``OMNIJOBS_PIPELINE_OPTIONS[<name>]``): ``model`` (checkpoint path or hub id),
``deploy_config`` (a vLLM-Omni deploy yaml, e.g. ``audex_tts.yaml``), ``engine_kwargs``,
and ``engine_factory`` / ``tokenizer_factory`` (``"module:function"``; the tests point
them at a fake engine with the real output shapes).

What the engine is (TTS, TTA or text-only) is read from its stage set, never from the
model name: a deployment whose engine is not what the pipeline serves refuses to
start. Prompts come from vLLM-Omni's own Audex prompt builder. Classifier-free guidance
pairs (``cfg_role``, ``cfg_pair_id``, ``cfg_null_prompt``) and the TTA RVQ mask are set
here per job; callers may only choose ``cfg_scale``.

Slots: a worker keeps as many Audex jobs in flight as the engine decodes at once, the
smallest ``max_num_seqs`` of its stages (8 in every shipped Audex deploy), unless the
option ``slots`` says otherwise; a guided job holds two (its unconditional companion is
a sequence of its own, audex_tts.yaml:18-21). The tokenizer is shared by those jobs'
threads behind a lock (a Rust-backed tokenizer refuses to be borrowed twice at once).

Every stage streams DELTA outputs, as vLLM-Omni's speech server does for streaming
(entrypoints/openai/serving_speech.py:1942-1955, entrypoints/utils.py:342-356): each
output carries only the audio decoded since the previous one, so nothing is copied
twice (CUMULATIVE re-concatenates the whole waveform at every step,
outputs/output_processor.py:219-222) and each chunk can be streamed on as it comes.

TTS length: the thinker emits one codec frame per 320-sample hop at 16 kHz (50 per
second) and stops at ``max_tokens`` (2048, about 41 s, audex_tts.yaml:56-60) or when its
4096-token context is full (audex_tts.yaml:49). Each job's ``max_tokens`` is raised
from its text to what a slow speaker needs, within that context; the spec caps the text
so it fits; and speech that still reaches the limit fails as ``speech_truncated``
rather than completing cut short. Option ``max_model_len`` follows a deploy yaml that
changes stage 0's context.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, Literal

from core.errors import ConfigurationError, EngineRejected, OutputInvalid
from core.jobs import JobKind
from media.validate import AudioBounds

from .base import AudioPiece, Pipeline, PipelineSpec, RunContext, SpeechRequest
from .omni_bridge import (
    OmniBridge,
    gpu_import,
    import_object,
    output_kind,
    scalar,
    stage_max_num_seqs,
    startup_kwargs,
    to_numpy,
)
from .registry import register_pipeline
from .weights import check_modules_cache, check_prepared, check_reachable

Mode = Literal["tts", "tta", "text"]
# Copied: the modules defining these import torch, vllm or transformers; tests pin them.
SAMPLE_RATE = 16000  # speech_decoder/configuration_audex_causal_speech_decoder.py:31
CODEC_HOP = 320  # speech_decoder/configuration_audex_causal_speech_decoder.py:28
CODES_PER_S = SAMPLE_RATE // CODEC_HOP
TTS_CONTEXT_TOKENS = 4096  # stage-0 max_model_len, audex_tts.yaml:49, audex_tts_30b.yaml:47
SLOWEST_CHARS_PER_S = 10.0  # a slow speaker: the budget a text gets
TTS_MAX_INPUT_CHARS = 700  # 72 s at that pace plus the prompt fits the context
TRUNCATION_SLACK_CODES = 25  # one codec chunk (audex_tts.yaml:33)
CFG_FIELDS = frozenset({"cfg_role", "cfg_pair_id", "cfg_null_prompt", "tta_rvq"})
GUIDED_TTS_TEMPERATURE = 0.05  # tts_adapters/audex.py:166
TTA_DEFAULT_CFG = 3.0  # tts_adapters/audex_tta.py:22
TTA_MAX_SECONDS = 10.0  # audex_tta.yaml:8-9
# tta.py:47-48; the cap is written inline at tts_adapters/audex_tta.py:139
RVQ_CODEBOOKS, RVQ_CODEBOOK_SIZE, RVQ_CODEC_CAP = 4, 1024, 4000
ENGINE_FACTORY = "pipelines.omni_bridge:build_async_omni"
TOKENIZER_FACTORY = "pipelines.audex:load_tokenizer"


def detect_mode(stages: set[str]) -> Mode:
    """TTS: ``audex_thinker``, or ``audex_omni`` with ``audex_code2wav``; TTA:
    ``audex_tta_thinker``; ``audex_omni`` alone is a text-only (thinker) deployment."""
    if "audex_tta_thinker" in stages:
        return "tta"
    if "audex_thinker" in stages or {"audex_omni", "audex_code2wav"} <= stages:
        return "tts"
    if "audex_omni" in stages:
        return "text"
    raise ConfigurationError(f"not an Audex engine (stages: {sorted(stages)})")


def prompt_module() -> Any:
    """vLLM-Omni's Audex prompt builder. The package's ``__init__`` needs torch, the
    builder itself imports nothing, so without torch it is loaded from its file."""
    name = "vllm_omni.model_executor.models.audex.prompt"
    try:
        return importlib.import_module(name)
    except ImportError:
        spec = importlib.util.find_spec("vllm_omni")
        if spec is None or not spec.submodule_search_locations:
            raise ConfigurationError("vllm-omni is not installed (pip install "
                                     "'omnijobs[gpu]')") from None
        path = Path(spec.submodule_search_locations[0], *name.split(".")[1:]).with_suffix(".py")
        file_spec = importlib.util.spec_from_file_location("_audex_prompt", path)
        module = importlib.util.module_from_spec(file_spec)
        file_spec.loader.exec_module(module)
        return module


def tokenizer_folder(stages: set[str]) -> str:
    """``audex_omni`` (speech-to-speech) reads the full checkpoint, the others the
    audiogen one (entrypoints/openai/tts_adapters/audex.py:50-52)."""
    return "checkpoint_folder_full" if "audex_omni" in stages else "checkpoint_folder_audiogen"


def repository_root(model: str) -> str:
    """The checkpoint root the engine needs. Each Audex stage names its own folder
    (``checkpoint_folder_audiogen``, ``audex_causal_speech_decoder``, ...), which the
    engine joins onto the path it is given and refuses when missing
    (engine/stage_init_utils.py:234-303, :259-269), so a path to one of the
    ``checkpoint_folder_*`` folders (as vLLM-Omni's own Audex adapter accepts one,
    tts_adapters/audex.py:53-59) is passed on as the folder above it."""
    path = os.path.normpath(model)
    if os.path.basename(path).startswith("checkpoint_folder"):
        return os.path.dirname(path)
    return model


def load_tokenizer(model: str, folder: str = "checkpoint_folder_audiogen") -> Any:
    """The thinker's tokenizer, for CFG null prompts and token budgets, from the
    checkpoint root (a path or hub id)."""
    return gpu_import("transformers").AutoTokenizer.from_pretrained(model, subfolder=folder)


def tta_rvq(tokenizer: Any) -> dict[str, Any]:
    """The RVQ phase mask TTA decoding needs: tokenizer ids of ``<audiocodec_N>`` per
    codebook. (vLLM-Omni's ``build_tta_phase_token_ids`` computes the same but its module
    needs torch and vllm, so it cannot be shared with CPU installs.)"""
    vocab = tokenizer.get_vocab()
    start, end = vocab.get("<audiogen_start>"), vocab.get("<audiogen_end>")
    if start is None or end is None:
        raise ConfigurationError("tokenizer lacks <audiogen_start>/<audiogen_end>")
    phases = []
    for phase in range(RVQ_CODEBOOKS):
        ids = [vocab.get(f"<audiocodec_{c}>") for c in
               range(phase * RVQ_CODEBOOK_SIZE, (phase + 1) * RVQ_CODEBOOK_SIZE)]
        if None in ids:
            raise ConfigurationError(f"tokenizer lacks codec tokens for RVQ phase {phase}")
        phases.append(ids)
    return {"phase_token_ids": phases, "start_tid": int(start), "end_tid": int(end),
            "codec_cap": RVQ_CODEC_CAP, "start_in_prompt": True}


def audio_pieces(mm: Any, default_rate: int) -> list[AudioPiece]:
    """The new audio in one DELTA output's ``multimodal_output``: key "audio" (or
    "model_outputs"), a tensor or a list of chunks not yet concatenated (the engine
    appends chunks and joins them only when a request finishes, outputs/mm_outputs.py:
    154-175), each new audio, in order; ``sr`` an int, a 0-d tensor or a list of them."""
    if not mm:
        return []
    key = "audio" if "audio" in mm else "model_outputs" if "model_outputs" in mm else None
    if key is None or mm[key] is None:
        return []
    rate = int(scalar(mm.get("sr")) or default_rate)
    value = mm[key]
    chunks = value if isinstance(value, (list, tuple)) else [value]
    return [AudioPiece(to_numpy(c).reshape(-1), rate) for c in chunks
            if c is not None and _length(c) > 0]


def _length(snapshot: Any) -> int:
    shape = getattr(snapshot, "shape", None)
    return int(shape[-1]) if shape else len(snapshot)


class AudexPipeline(Pipeline):
    mode: ClassVar[Mode]
    default_model: ClassVar[str]
    context_tokens: ClassVar[int] = TTS_CONTEXT_TOKENS
    # init_timeout and stage_init_timeout: room for a cold 30B load from a network volume
    start_timeouts_s: ClassVar[tuple[float, float]] = (1800.0, 900.0)

    @property
    def timeout_s(self) -> float:
        """Longest silence from the engine before it counts as hung (option
        ``request_timeout_s``)."""
        return float(self.options.get("request_timeout_s", 300))

    def load(self) -> None:
        model = repository_root(self.options.get("model", self.default_model))
        check_reachable(model, self.spec.name)
        check_prepared(model)  # before the engine writes into a folder it cannot
        check_modules_cache()
        deploy = self.deploy_config(self.options)
        factory = import_object(self.options.get("engine_factory", ENGINE_FACTORY))
        kwargs = startup_kwargs(self.options, *self.start_timeouts_s)
        self._bridge = OmniBridge(lambda: factory(model, deploy, **kwargs))
        found = detect_mode(self._bridge.stages)
        if found != self.mode:
            raise ConfigurationError(f"{self.spec.name} serves {self.mode.upper()} but deploy "
                                     f"config {deploy} builds a {found.upper()} engine")
        self._tokenizer = import_object(self.options.get("tokenizer_factory", TOKENIZER_FACTORY))(
            model, tokenizer_folder(self._bridge.stages))
        self._tokenizer_lock = threading.Lock()
        self._context = int(self.options.get("max_model_len", self.context_tokens))
        self._prompts = prompt_module()
        self._rvq = tta_rvq(self._tokenizer) if self.mode == "tta" else None
        for _ in self.speech(SpeechRequest(input="Warm up."), RunContext(job_id="warmup")):
            pass  # one real request before the worker takes jobs

    def close(self, timeout_s: float) -> None:
        self._bridge.close(timeout_s)

    def slots(self) -> int:
        if "slots" in self.options:
            return super().slots()
        return min(stage_max_num_seqs(self._bridge.engine), default=1)

    def cfg_scale(self, extra: dict[str, Any]) -> float | None:
        """The job's guidance: its own ``cfg_scale``, else TTA's default."""
        cfg_scale = extra.get("cfg_scale")
        return TTA_DEFAULT_CFG if cfg_scale is None and self.mode == "tta" else cfg_scale

    def slot_weight(self, request: dict[str, Any]) -> int:
        cfg_scale = self.cfg_scale(request)  # a speech request's extra fields are its own
        return 2 if cfg_scale is not None and cfg_scale > 1.0 else 1

    def cond_prompt(self, text: str) -> str:
        if self.mode == "tta":
            return self._prompts.build_tta_cond_prompt(text)
        return self._prompts.build_cond_prompt(text)

    def null_prompt(self, cond: str) -> str:
        """The guidance pair's unconditional prompt, as long as ``cond`` in tokens. The
        builder raises ValueError when no ``<unk>`` count matches (prompt.py:56-67): the
        request cannot be guided, which is the request's problem, not the service's."""
        build = (self._prompts.build_tta_null_prompt if self.mode == "tta"
                 else self._prompts.build_null_prompt)
        try:
            with self._tokenizer_lock:
                return build(cond, self._tokenizer)
        except ValueError as exc:
            raise EngineRejected(f"cfg_scale cannot be applied to this input ({exc}); send it "
                                 "without cfg_scale", code="cfg_unavailable") from exc

    def token_budget(self, cond: str, text: str, default: int | None) -> int:
        """Codec frames the thinker may emit for ``text``: what a slow speaker needs (at
        least the deploy's default), never more than the prompt leaves of the context."""
        with self._tokenizer_lock:
            room = self._context - len(self._tokenizer.encode(cond))
        want = math.ceil((len(text) / SLOWEST_CHARS_PER_S + 2) * CODES_PER_S)
        return max(1, min(room, max(default or 0, want)))

    def request_params(self, cond: str, text: str, cfg_scale: float | None,
                       request_id: str) -> list:
        """Deep-copied engine defaults with this job's output kind, length, guidance and
        masks set."""
        params = self._bridge.default_params()
        for p in params:
            p.output_kind = output_kind("DELTA")
        stage0 = params[0]
        if self.mode == "tts":
            stage0.max_tokens = self.token_budget(cond, text, stage0.max_tokens)
        if getattr(stage0, "extra_args", None) is None:
            stage0.extra_args = {}
        extra = stage0.extra_args
        if self._rvq is not None:
            extra["tta_rvq"] = self._rvq
        extra.pop("cfg_scale", None)
        if cfg_scale is not None and cfg_scale > 1.0:
            extra.update(cfg_scale=float(cfg_scale), cfg_role="cond", cfg_pair_id=request_id,
                         cfg_null_prompt=self.null_prompt(cond))
            if self.mode == "tts":
                stage0.temperature = GUIDED_TTS_TEMPERATURE
        return params

    def speech(self, request: SpeechRequest, ctx: RunContext) -> Iterator[AudioPiece]:
        cond = self.cond_prompt(request.input)
        request_id = f"{ctx.job_id}-{uuid.uuid4().hex[:8]}"
        params = self.request_params(cond, request.input, self.cfg_scale(request.extra),
                                     request_id)
        expected_s = TTA_MAX_SECONDS if self.mode == "tta" else max(1.0, len(request.input) / 14)
        samples = 0
        for out in self._bridge.stream({"prompt": cond}, params, request_id,
                                       ctx.is_cancelled, ["audio"], self.timeout_s):
            for piece in audio_pieces(out.multimodal_output, SAMPLE_RATE):
                samples += len(piece.samples)
                yield piece
                ctx.report_progress(min(0.95, samples / SAMPLE_RATE / expected_s))
        if self.mode == "tts":
            check_not_cut(samples, params[0].max_tokens)


def check_not_cut(samples: int, max_tokens: int | None) -> None:
    """Speech that reaches the thinker's token limit was cut mid-text: fail, never
    complete with it. (A natural stop within one codec chunk of the limit reads the same.)"""
    if max_tokens and samples >= (max_tokens - TRUNCATION_SLACK_CODES) * CODEC_HOP:
        raise OutputInvalid(f"speech reached the engine's limit of {max_tokens} codec frames "
                            f"({max_tokens / CODES_PER_S:.0f} s) and was cut; send shorter "
                            "text", code="speech_truncated")


def _spec(name: str, mode: Mode, models: tuple[str, ...]) -> PipelineSpec:
    tts = mode == "tts"
    return PipelineSpec(
        name=name, kind=JobKind.SPEECH, models=models,
        description=f"Nemotron Audex {mode.upper()} on vLLM-Omni (GPU)",
        audio_mode="incremental", sample_rate=SAMPLE_RATE, channels=1,
        max_input_chars=TTS_MAX_INPUT_CHARS if tts else 4096,
        audio_bounds=AudioBounds(min_s=0.05, max_s=TTS_CONTEXT_TOKENS / CODES_PER_S if tts
                                 else TTA_MAX_SECONDS + 0.5), voices=None,
        extra_fields=frozenset({"cfg_scale"}), numeric_fields=(("cfg_scale", 1.0, 10.0),),
        reserved_fields=CFG_FIELDS, supports_speed=False)


@register_pipeline
class AudexTTS(AudexPipeline):
    mode = "tts"
    default_model = "nvidia/Nemotron-Labs-Audex-2B"
    default_deploy = "audex_tts.yaml"
    spec = _spec("audex-tts", "tts", ("nvidia/Nemotron-Labs-Audex-2B", "audex-tts"))


@register_pipeline
class AudexTTS30B(AudexPipeline):
    mode = "tts"
    default_model = "nvidia/Nemotron-Labs-Audex-30B-A3B"
    default_deploy = "audex_tts_30b.yaml"
    spec = _spec("audex-tts-30b", "tts",
                 ("nvidia/Nemotron-Labs-Audex-30B-A3B", "audex-tts-30b"))


@register_pipeline
class AudexTTA(AudexPipeline):
    mode = "tta"
    default_model = "nvidia/Nemotron-Labs-Audex-2B"
    default_deploy = "audex_tta.yaml"
    spec = _spec("audex-tta", "tta", ("audex-tta", "nvidia/Nemotron-Labs-Audex-2B:tta"))


@register_pipeline
class AudexTTA30B(AudexPipeline):
    mode = "tta"
    default_model = "nvidia/Nemotron-Labs-Audex-30B-A3B"
    default_deploy = "audex_tta_30b.yaml"
    spec = _spec("audex-tta-30b", "tta",
                 ("audex-tta-30b", "nvidia/Nemotron-Labs-Audex-30B-A3B:tta"))
