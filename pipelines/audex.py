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
"""

from __future__ import annotations

import importlib
import importlib.util
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, Literal

from core.errors import ConfigurationError
from core.jobs import JobKind
from media.validate import AudioBounds

from .base import AudioPiece, Pipeline, PipelineSpec, RunContext, SpeechRequest
from .omni_bridge import OmniBridge, import_object, output_kind, scalar, to_numpy
from .registry import register_pipeline

Mode = Literal["tts", "tta", "text"]
SAMPLE_RATE = 16000
CFG_FIELDS = frozenset({"cfg_role", "cfg_pair_id", "cfg_null_prompt", "tta_rvq"})
GUIDED_TTS_TEMPERATURE = 0.05
TTA_DEFAULT_CFG = 3.0
TTA_MAX_SECONDS = 10.0
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


def load_tokenizer(model: str) -> Any:
    """The thinker's tokenizer (``checkpoint_folder_audiogen``), for CFG null prompts."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model, subfolder="checkpoint_folder_audiogen")


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
    """Audio from ``multimodal_output``: key "audio" (or "model_outputs"), a tensor or a
    list of cumulative snapshots (only the longest is copied off the device; the
    aggregator would keep no other); ``sr`` an int, a 0-d tensor or a list of them."""
    if not mm:
        return []
    key = "audio" if "audio" in mm else "model_outputs" if "model_outputs" in mm else None
    if key is None or mm[key] is None:
        return []
    rate = int(scalar(mm.get("sr")) or default_rate)
    value = mm[key]
    if isinstance(value, (list, tuple)):  # a history of cumulative snapshots
        value = max((v for v in value if v is not None), key=_length, default=None)
    return [] if value is None else [AudioPiece(to_numpy(value).reshape(-1), rate)]


def _length(snapshot: Any) -> int:
    shape = getattr(snapshot, "shape", None)
    return int(shape[-1]) if shape else len(snapshot)


class AudexPipeline(Pipeline):
    mode: ClassVar[Mode]
    default_model: ClassVar[str]
    default_deploy: ClassVar[str]

    @property
    def timeout_s(self) -> float:
        """Longest silence from the engine before it counts as hung (option
        ``request_timeout_s``)."""
        return float(self.options.get("request_timeout_s", 300))

    def load(self) -> None:
        model = self.options.get("model", self.default_model)
        deploy = self.options.get("deploy_config", self.default_deploy)
        factory = import_object(self.options.get("engine_factory", ENGINE_FACTORY))
        kwargs = self.options.get("engine_kwargs", {})
        self._bridge = OmniBridge(lambda: factory(model, deploy, **kwargs))
        found = detect_mode(self._bridge.stages)
        if found != self.mode:
            raise ConfigurationError(f"{self.spec.name} serves {self.mode.upper()} but deploy "
                                     f"config {deploy} builds a {found.upper()} engine")
        self._tokenizer = import_object(self.options.get("tokenizer_factory",
                                                         TOKENIZER_FACTORY))(model)
        self._prompts = prompt_module()
        self._rvq = tta_rvq(self._tokenizer) if self.mode == "tta" else None
        for _ in self.speech(SpeechRequest(input="Warm up."), RunContext(job_id="warmup")):
            pass  # one real request before the worker takes jobs

    def cond_prompt(self, text: str) -> str:
        if self.mode == "tta":
            return self._prompts.build_tta_cond_prompt(text)
        return self._prompts.build_cond_prompt(text)

    def null_prompt(self, cond: str) -> str:
        if self.mode == "tta":
            return self._prompts.build_tta_null_prompt(cond, self._tokenizer)
        return self._prompts.build_null_prompt(cond, self._tokenizer)

    def request_params(self, cond: str, cfg_scale: float | None, request_id: str) -> list:
        """Deep-copied engine defaults with this job's guidance and masks set."""
        params = self._bridge.default_params()
        for p in params:
            p.output_kind = output_kind("CUMULATIVE")
        stage0 = params[0]
        if getattr(stage0, "extra_args", None) is None:
            stage0.extra_args = {}
        extra = stage0.extra_args
        if self._rvq is not None:
            extra["tta_rvq"] = self._rvq
        if cfg_scale is None and self.mode == "tta":
            cfg_scale = TTA_DEFAULT_CFG
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
        params = self.request_params(cond, request.extra.get("cfg_scale"), request_id)
        expected_s = TTA_MAX_SECONDS if self.mode == "tta" else max(1.0, len(request.input) / 14)
        for out in self._bridge.stream({"prompt": cond}, params, request_id,
                                       ctx.is_cancelled, ["audio"], self.timeout_s):
            for piece in audio_pieces(out.multimodal_output, SAMPLE_RATE):
                yield piece
                ctx.report_progress(min(0.95, len(piece.samples) / SAMPLE_RATE / expected_s))


def _spec(name: str, mode: Mode, models: tuple[str, ...], max_s: float) -> PipelineSpec:
    return PipelineSpec(
        name=name, kind=JobKind.SPEECH, models=models,
        description=f"Nemotron Audex {mode.upper()} on vLLM-Omni (GPU)",
        audio_mode="cumulative", sample_rate=SAMPLE_RATE, channels=1, max_input_chars=4096,
        audio_bounds=AudioBounds(min_s=0.05, max_s=max_s), voices=None,
        extra_fields=frozenset({"cfg_scale"}), numeric_fields=(("cfg_scale", 1.0, 10.0),),
        reserved_fields=CFG_FIELDS, supports_speed=False)


@register_pipeline
class AudexTTS(AudexPipeline):
    mode = "tts"
    default_model = "nvidia/Nemotron-Labs-Audex-2B"
    default_deploy = "audex_tts.yaml"
    spec = _spec("audex-tts", "tts", ("nvidia/Nemotron-Labs-Audex-2B", "audex-tts"), 600.0)


@register_pipeline
class AudexTTS30B(AudexPipeline):
    mode = "tts"
    default_model = "nvidia/Nemotron-Labs-Audex-30B-A3B"
    default_deploy = "audex_tts_30b.yaml"
    spec = _spec("audex-tts-30b", "tts",
                 ("nvidia/Nemotron-Labs-Audex-30B-A3B", "audex-tts-30b"), 600.0)


@register_pipeline
class AudexTTA(AudexPipeline):
    mode = "tta"
    default_model = "nvidia/Nemotron-Labs-Audex-2B"
    default_deploy = "audex_tta.yaml"
    spec = _spec("audex-tta", "tta", ("audex-tta", "nvidia/Nemotron-Labs-Audex-2B:tta"),
                 TTA_MAX_SECONDS + 0.5)


@register_pipeline
class AudexTTA30B(AudexPipeline):
    mode = "tta"
    default_model = "nvidia/Nemotron-Labs-Audex-30B-A3B"
    default_deploy = "audex_tta_30b.yaml"
    spec = _spec("audex-tta-30b", "tta",
                 ("audex-tta-30b", "nvidia/Nemotron-Labs-Audex-30B-A3B:tta"),
                 TTA_MAX_SECONDS + 0.5)
