"""A fake vLLM-Omni ``AsyncOmni``, as strict as vllm-omni 0.30.0, for CPU tests.

It is the GPU boundary and nothing more. What vllm-omni itself defines is read from the
installed package rather than copied (``tests/omni_source.py``): each deploy config's
stage names (the ``PipelineConfig`` topologies) and default sampling params (the deploy
yaml plus the stage's sampling constraints), ``OmniClientError``, Audex's decoder hop,
rate, chunking and TTA frame cap, and MiniMax-H3's own request-shape resolver
(``resolve_minimax_h3_shape``, run on our params: explicit ``aspect_ratio``, 4-15 s,
fps 24, frames rounded up to 17n+5, sizes floored to a multiple of 32; a bad request
raises ``OmniClientError`` from ``generate``).

Behaviour per engine:
- Audex TTS/TTA: one codec frame per 320-sample hop at 16 kHz; stage 0 stops at its
  ``max_tokens`` or when the prompt fills ``max_model_len`` (long text is cut, as the
  real engine cuts it); the final stage's ``output_kind`` decides the output shape:
  DELTA outputs carry only new samples (several unconsolidated chunks in a list,
  the finished one a tensor), CUMULATIVE outputs a consolidated snapshot per step,
  FINAL_ONLY one finished output. TTA is one full-payload output capped at 10 s.
- MiniMax-H3: frames (B outputs, seed + index each) with (B, 2, N) 32 kHz audio on
  H3's own 40 Hz latent grid plus a decoder edge of up to one latent (so not exactly the
  clip's length, as a real decoder's is not), or pre-encoded MP4s written like vLLM-Omni's
  ``mux_av_video_audio_bytes`` (index at the end, no faststart) with ``audio: [None]``.

Audex requests are batched as vLLM batches them (``StepScheduler``): each stage holds at
most its deploy's ``max_num_seqs`` sequences (a guided request's unconditional companion
is a second stage-0 sequence), a request beyond them waits inside the engine, first come
first served, and every decode step emits one codec frame for each running request and
costs ``STEP_BASE_S + STEP_PER_SEQ_S x running sequences``. The engine keeps the peak
number of sequences it held (``peak_seqs``; ``stats_file`` writes it out of process,
with each request's wall-clock times in, admitted and out), and while ``hold_file``
exists it admits requests but runs no step (a GPU held still, so a test can see what it
was given).

Prompt markers choose failure behaviour: ``[silent]``, ``[slow]`` (for H3: 6 ms per
frame of every clip before its one answer), ``[die]`` (once per
``die_marker`` file: the engine dies with every request it holds, and refuses any new
one, as a vLLM engine whose core died does), ``[model_outputs]``, ``[hang]``,
``[engine-abort]``, ``[guardrail]`` (a GuardrailViolationError, i.e. an OmniClientError)
and ``[drawl]`` (a speaker four times slower than usual). ``[slow]`` Audex speech takes
at least 10 ms a frame.
"""

from __future__ import annotations

import asyncio
import copy
import importlib.metadata
import io
import json
import logging
import math
import os
import re
import shutil
import time
import zlib
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import av
import numpy as np

from pipelines.devices import check_visible
from pipelines.omni_bridge import check_engine_stack, check_torch_build
from tests import omni_source as src

OmniClientError = src.errors_module().OmniClientError
GuardrailViolationError = src.errors_module().GuardrailViolationError

# ---- what vllm-omni defines, read from its source ------------------------------------

_TOPOLOGIES = {**src.pipelines("model_executor/models/audex/pipeline.py"),
               **src.pipelines("model_executor/models/minimax_h3/pipeline.py")}
DEPLOY_NAMES = ("audex_tts.yaml", "audex_tts_30b.yaml", "audex_tta.yaml", "audex_tta_30b.yaml",
                "audex_s2s.yaml", "audex_thinker_only.yaml", "minimax_h3_disaggregated.yaml")


def topology(deploy_config: str) -> list[tuple[str, str, dict]]:
    """(model_stage, execution type, default sampling params) per stage of a shipped
    deploy: the yaml's ``default_sampling_params`` under the stage's constraints."""
    yml = src.deploy(deploy_config)
    stages = _TOPOLOGIES[yml["pipeline"]]
    return [(st.model_stage, st.execution_type,
             {**stage.get("default_sampling_params", {}), **st.constraints})
            for st, stage in zip(stages, yml["stages"], strict=True)]


def stage0_yaml(deploy_config: str) -> dict:
    return src.deploy(deploy_config)["stages"][0]


DEPLOYS = {name: tuple(stage for stage, _, _ in topology(name)) for name in DEPLOY_NAMES}

_H3 = "model_executor/models/minimax_h3/"
_H3_CONST = {**src.constants(_H3 + "preprocessing.py"),
             **src.constants(_H3 + "encoder_processing.py"),
             **src.constants(_H3 + "long_video.py"),
             **src.constants("diffusion/models/minimax_h3/vae.py")}
_TIME = "diffusion/models/minimax_h3/time_request.py"
_h3_ns = {"math": math, "np": np, "Mapping": Mapping, "OmniClientError": OmniClientError,
          **_H3_CONST}
_h3_ns["_align_multiple"] = src.function(_H3 + "preprocessing.py", "_align_multiple")
for _name in ("resolve_minimax_h3_aspect_ratio", "resolve_minimax_h3_output_canvas"):
    _h3_ns[_name] = src.function(_H3 + "preprocessing.py", _name, **_h3_ns)
_h3_ns["resolve_long_video_mode"] = src.function(_H3 + "long_video.py", "resolve_long_video_mode",
                                                 **_h3_ns)
_h3_ns["max_output_seconds"] = src.function(_H3 + "long_video.py", "max_output_seconds", **_h3_ns)
_h3_ns["minimax_h3_align_frame_count"] = src.function(_TIME, "_align_frame_count")
_h3_ns["MINIMAX_H3_SHAPE_PLANNER"] = SimpleNamespace(
    video_latent_t=src.function(_TIME, "_video_latent_t"),
    audio_latent_t=src.function(_TIME, "_audio_latent_t"))
h3_shape = src.function(_H3 + "encoder_processing.py", "resolve_minimax_h3_shape", **_h3_ns)
H3_FPS = _H3_CONST["MINIMAX_H3_FPS"]
H3_RATE = _H3_CONST["MINIMAX_H3_AUDIO_SAMPLE_RATE"]
H3_AUDIO_LATENT_HZ = 40  # time_request.py:34-36 rounds audio at the 40 Hz latent boundary
# The audio VAE decoder is the checkpoint's own code (vae.py:1071-1072) and its waveform
# is handed back untrimmed (pipeline_minimax_h3.py:2095-2097, :352-396), so a real track
# is not exactly its latent count x 800 samples: the fake's runs up to one latent either
# way (per request seed), on top of the latent grid's own rounding against the video.
H3_DECODER_EDGE = H3_RATE // H3_AUDIO_LATENT_HZ
H3_SLOW_S_PER_FRAME = 0.006  # "[slow]": render time per frame of every clip
H3_DEFAULT_SEED = 42  # pipeline_minimax_h3.py:2595 (and minimax_h3_disaggregated.yaml:45)

_AUDEX = "model_executor/models/audex/"
_DECODER = src.defaults(_AUDEX + "speech_decoder/configuration_audex_causal_speech_decoder.py",
                        "AudexCausalSpeechDecoderConfig")
SR, HOP = _DECODER["sample_rate"], _DECODER["hop_length"]
# XCodec decodes at most 500 frames at 50 per second (audex_tta.yaml:8-9)
TTA_CAP_S = src.constants(_AUDEX + "audex_xcodec.py")["_DEFAULT_MAX_TTA_FRAMES"] / 50
_STREAM = src.deploy("audex_tts.yaml")["connectors"]["connector_of_shared_memory"]["extra"]
CHUNK_FRAMES, FIRST_CHUNK_FRAMES = (_STREAM["codec_chunk_frames"],
                                    _STREAM["initial_codec_chunk_frames"])


# ---- what the real engine refuses at construction -------------------------------------

# The structured owners of engine arguments (config/omni_config.py:106-278, 790-): every
# stage owns the common ones, LLM stages the pooling ones, diffusion stages the
# diffusion projection's. The real config raises ValueError for a stage field that no
# stage of the pipeline owns (:420-440, :1299-1327); the fake refuses every name without
# an owner (the real one leaves a name it has never heard of unused, which is no better).
_CFG = "config/omni_config.py"
_COMMON_OWNED = frozenset({"compilation_config", "profiler_config"}).union(
    *(src.annotations(_CFG, f"_{c}EngineOverrides") for c in (
        "Quantization", "Model", "Load", "Cache", "Scheduler", "Runtime", "ParallelConfig",
        "Parallel", "Connector")))
OWNED = {"LLM_AR": _COMMON_OWNED | src.annotations(_CFG, "_PoolingEngineOverrides"),
         "DIFFUSION": _COMMON_OWNED | src.annotations(_CFG, "_DiffusionConfigProjection")}
OWNED["LLM_GENERATION"] = OWNED["LLM_AR"]
# The entrypoint's own keywords (entrypoints/omni_base.py:181-206,
# engine/omni_engine_base.py:130-196), and the fake's own die_marker.
ENTRYPOINT_KWARGS = frozenset({
    "stage_init_timeout", "init_timeout", "log_stats", "enable_ar_profiler", "async_chunk",
    "output_modalities", "tts_batch_max_items", "tokenizer", "trust_remote_code",
    "enable_orch_monitor", "omni_master_address", "omni_master_port", "omni_dp_size_local",
    "omni_lb_policy", "omni_heartbeat_timeout", "parallel_stage_init",
    "die_marker", "hold_file", "stats_file", "step_cost_s", "load_s", "shutdown_file",
    "shutdown_s"})  # the fake's own: these seven
REMOVED_KWARGS = {"diffusion_batch_size": "max_num_seqs",  # omni_base.py:192-196
                  "log_requests": "log_stats"}
INIT_TIMEOUT_S, STAGE_INIT_TIMEOUT_S = 600, 300  # vLLM-Omni's defaults, omni_base.py:181-182
# One thing broken on purpose, for the GPU smoke check's own tests: "silent" (zero audio),
# "rate" (speech at 22050 Hz), "stuck-cancel" (the engine stops stepping after an abort)
BREAK = os.environ.get("FAKE_OMNI_BREAK", "")
FAKE_VLLM_VERSION = "0.30.0"  # the vllm the fake stands in for: vllm-omni 0.30.0's line


def check_engine_kwargs(pipeline: str, stages: list[src.Stage], kwargs: dict) -> None:
    for old, new in REMOVED_KWARGS.items():
        if old in kwargs:
            raise TypeError(f"`{old}` has been removed in Omni/AsyncOmni. Use `{new}`.")
    owned = set().union(*(OWNED[st.execution_type] for st in stages))
    unowned = []
    for key in set(kwargs) - ENTRYPOINT_KWARGS:
        scoped = re.fullmatch(r"stage_(\d+)_(\w+)", key)
        if scoped:  # stage-scoped: that stage must exist and own the field
            index, name = int(scoped.group(1)), scoped.group(2)
            if index >= len(stages) or name not in OWNED[stages[index].execution_type]:
                unowned.append(key)
        elif key not in owned:
            unowned.append(key)
    if unowned:
        raise ValueError(f"Pipeline {pipeline!r} has explicit engine argument(s) with no "
                         f"structured config owner: {', '.join(sorted(unowned))}")


def check_model_path(model: str, stages: list[src.Stage]) -> None:
    """Each stage's folder is joined onto ``model`` (engine/stage_init_utils.py:234-303):
    a local folder must hold every one (:259-269); a path that is not a folder is taken
    for a hub id, and a ``checkpoint_folder_*`` path is no repository
    (model_executor/models/audex/checkpoint.py:92-124)."""
    subdirs = [d for st in stages for d in st.subdirs]
    if not subdirs:
        return
    if Path(model).is_dir():
        missing = sorted({d for d in subdirs if not (Path(model) / d).is_dir()})
        if missing:
            raise RuntimeError(f"[stage_init] Model directory {model!r} has no {missing} "
                               "subfolder; the stage cannot be initialized from it.")
    elif Path(model).name.startswith("checkpoint_folder"):
        raise RuntimeError(f"Could not resolve the Audex repo {model!r} (profile 'tts'): the "
                           "download failed and no cached snapshot with the required "
                           "folders was found.")


def fake_stack() -> dict[str, str | None]:
    """The engine stack the fake pretends to be: the installed vllm-omni (whose source
    it reads) beside the vllm it stands in for (``FAKE_OMNI_VLLM_VERSION`` overrides)."""
    return {"vllm": os.environ.get("FAKE_OMNI_VLLM_VERSION", FAKE_VLLM_VERSION),
            "vllm-omni": importlib.metadata.version("vllm-omni")}


# vLLM-Omni's own shard linking (model_executor/models/audex/checkpoint.py:153-186),
# compiled from the wheel's source: its module imports vllm. The engine runs it for these
# stages' model folders on every start (engine/stage_init_utils.py:1286-1292).
_CHECKPOINT = "model_executor/models/audex/checkpoint.py"
ensure_audiogen_weights = src.function(
    _CHECKPOINT, "ensure_audiogen_weights", os=os, json=json, shutil=shutil,
    logger=logging.getLogger("vllm_omni.audex.checkpoint"),
    _WEIGHT_SOURCE_FOLDER=src.constants(_CHECKPOINT)["_WEIGHT_SOURCE_FOLDER"])
LINKING_STAGES = ("audex_thinker", "audex_tta_thinker")


def link_weights(model: str, stages: list[src.Stage]) -> None:
    """The engine's first-start write into a local model folder: EROFS on a read-only
    mount, as the real engine fails there."""
    if not Path(model).is_dir():
        return
    for stage in stages:
        if stage.model_stage in LINKING_STAGES:
            ensure_audiogen_weights(os.path.join(model, stage.subdirs[0]))


def fake_torch(version: str | None = None) -> SimpleNamespace:
    """The torch the fake pretends to run on: a CUDA 13 build unless ``version`` or
    ``FAKE_OMNI_TORCH`` names another (``2.13.0+cpu``: what a CPU index hands out)."""
    version = version or os.environ.get("FAKE_OMNI_TORCH", "2.13.0+cu130")
    local = version.partition("+")[2]
    cuda = f"{local[2:4]}.{local[4:] or 0}" if local.startswith("cu") else None
    return SimpleNamespace(__version__=version, version=SimpleNamespace(cuda=cuda))


def fake_visible_gpus() -> int:
    """The GPUs a process sees on the fake's machine: ``FAKE_OMNI_GPUS`` physical ones
    (default 8, numbered from 0, as a container's runtime numbers those it was given),
    narrowed by CUDA_VISIBLE_DEVICES as CUDA narrows them: the listed ordinals, up to the
    first that names no device."""
    physical = int(os.environ.get("FAKE_OMNI_GPUS", "8"))
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return physical
    seen: list[int] = []
    for item in listed.split(","):
        if not item.strip().isdigit() or int(item) >= physical or int(item) in seen:
            break
        seen.append(int(item))
    return len(seen)


class FakeEngineDeadError(RuntimeError):
    """Named like vLLM-Omni's OmniEngineDeadError."""


@dataclass
class SamplingParams:
    """The vLLM fields the Audex stages use, with vLLM's own defaults."""

    temperature: float = 1.0
    top_k: int = 0
    max_tokens: int | None = 16
    seed: int | None = None
    detokenize: bool = True
    stop_token_ids: list[int] | None = None
    output_kind: Any = "CUMULATIVE"
    extra_args: dict | None = None


@dataclass
class DiffusionParams:
    """OmniDiffusionSamplingParams' fields MiniMax-H3 reads, with their defaults
    (vllm_omni/inputs/data.py:224-278)."""

    num_outputs_per_prompt: int = 1
    seed: int | None = None
    height: int | None = None
    width: int | None = None
    num_frames: int = 1
    fps: float | None = None
    frame_rate: float | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    extra_args: dict = field(default_factory=dict)


def default_params(deploy_config: str) -> list[Any]:
    params = []
    for _, kind, values in topology(deploy_config):
        cls = DiffusionParams if kind == "DIFFUSION" else SamplingParams
        names = cls.__dataclass_fields__
        params.append(cls(**{k: v for k, v in values.items() if k in names}))
    return params


def audio_samples(mm: dict) -> int:
    total = 0
    for key in ("audio", "model_outputs"):
        value = mm.get(key)
        for item in value if isinstance(value, list) else [value]:
            total += 0 if item is None else int(np.size(item))
    return total


def kind_name(kind: Any) -> str:
    return getattr(kind, "name", None) or str(kind)


def tensor(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)


def speech(seconds: float, text: str = "") -> np.ndarray:
    """A voice whose pitch follows the text, so two requests' audio never match."""
    t = np.arange(int(round(seconds * SR))) / SR
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 3 * t)
    pitch = 150 + zlib.crc32(text.encode()) % 150
    return tensor(0.3 * envelope * np.sin(2 * np.pi * pitch * t))


def output(mm: dict | None = None, *, finished: bool, reason: str | None = None,
           images: list | None = None) -> SimpleNamespace:
    return SimpleNamespace(finished=finished, images=images or [],
                           outputs=[SimpleNamespace(finish_reason=reason)],
                           multimodal_output=mm or {})


def codec_chunks(full: np.ndarray) -> list[np.ndarray]:
    """The code2wav stream: one frame first, then 25-frame chunks."""
    bounds = [0, FIRST_CHUNK_FRAMES * HOP]
    while bounds[-1] < len(full):
        bounds.append(bounds[-1] + CHUNK_FRAMES * HOP)
    return [full[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if a < len(full)]


# ---- batching: vLLM's step scheduler, as far as Audex shows it -------------------------

# One decode step of an Audex deploy on one Hopper-class GPU. Chosen and stated, not
# measured here (no GPU runs vLLM on this project's machines): a step of a 2B-parameter
# thinker reads its bf16 weights once whatever the batch (4 GB at 3.35 TB/s is 1.2 ms),
# and vLLM's scheduling, sampling, the CFG logits processor and the code2wav stage's
# share bring a small model's step to a few milliseconds; each sequence adds its KV
# reads and its sampler row, a small fraction of that. So 8 sequences cost 1.2x one.
STEP_BASE_S = 0.006
STEP_PER_SEQ_S = 0.00015
SLOW_FRAME_S = 0.01  # "[slow]" speech: at least this long a codec frame
HOLD_POLL_S = 0.01


def step_cost(given: Any = None) -> tuple[float, float]:
    """(base, per sequence) seconds of a step: the engine argument ``step_cost_s``, else
    ``FAKE_OMNI_STEP_COST_S`` ("base,per_seq"; the test suite sets "0,0", so tests that
    are not about time do not wait for it), else the Hopper figures above."""
    if given is None and os.environ.get("FAKE_OMNI_STEP_COST_S"):
        given = os.environ["FAKE_OMNI_STEP_COST_S"].split(",")
    base, per_seq = given if given is not None else (STEP_BASE_S, STEP_PER_SEQ_S)
    return float(base), float(per_seq)


def stage_max_num_seqs(deploy_config: str, kwargs: Mapping[str, Any]) -> tuple[int, ...]:
    """Each stage's ``max_num_seqs``: the deploy yaml's, under an engine argument
    ``max_num_seqs`` (every stage) or ``stage_<i>_max_num_seqs`` (one)."""
    stages = src.deploy(deploy_config)["stages"]
    return tuple(int(kwargs.get(f"stage_{i}_max_num_seqs") or kwargs.get("max_num_seqs")
                     or stage.get("max_num_seqs") or 1) for i, stage in enumerate(stages))


@dataclass
class Running:
    """One request in the scheduler: the frames it will emit, the frame counts at which
    an output is due, and the stage-0 sequences it holds (two when guided)."""

    request_id: str
    frames: int
    boundaries: list[int]
    seqs: int
    emit: Any  # (frames done, finished) -> output or None
    out: asyncio.Queue = field(default_factory=asyncio.Queue)
    frame_s: float = 0.0
    times: list[float] = field(default_factory=lambda: [time.time()])  # in, admitted, out
    done: int = 0
    next_at: float = 0.0
    aborted: bool = False


class StepScheduler:
    """Admits waiting requests while every stage has room (first come, first served: the
    head of the queue that does not fit holds the rest back, as vLLM's FCFS policy
    does), then steps: each running request emits one frame per step."""

    def __init__(self, capacity: tuple[int, ...], cost_s: tuple[float, float],
                 hold_file: str | None = None, stats_file: str | None = None) -> None:
        self.capacity, self.cost_s = capacity, cost_s
        self.hold_file, self.stats_file = hold_file, stats_file
        self.frozen = False
        self.waiting: deque[Running] = deque()
        self.running: list[Running] = []
        self.peak_seqs = self.steps = 0
        self.timings: dict[str, list[float]] = {}  # request id: wall clock in, admitted, out
        self.loop = asyncio.get_running_loop()
        self._task: asyncio.Task | None = None  # the step loop, while there is work

    def alive(self) -> bool:
        return self.loop is asyncio.get_running_loop() and not self.loop.is_closed()

    def need(self, r: Running) -> list[int]:
        """Sequences per stage: stage 0 holds the companion, the later stages do not."""
        return [r.seqs] + [1] * (len(self.capacity) - 1)

    def held(self) -> list[int]:
        held = [0] * len(self.capacity)
        for r in self.running:
            held = [h + n for h, n in zip(held, self.need(r), strict=True)]
        return held

    def submit(self, r: Running) -> None:
        if any(n > c for n, c in zip(self.need(r), self.capacity, strict=True)):
            raise ValueError(f"request {r.request_id} needs {r.seqs} sequences; stage 0 "
                             f"holds at most {self.capacity[0]}")
        self.waiting.append(r)
        if self._task is None or self._task.done():
            self._task = self.loop.create_task(self._run())

    def abort(self, request_id: str) -> None:
        for r in [*self.waiting, *self.running]:
            if r.request_id == request_id:
                r.aborted = True

    def die(self, error: BaseException) -> None:
        """The engine core is gone: every request it holds or queues gets the error, as
        vLLM's output handler puts an EngineDeadError into every request's queue."""
        for r in [*self.waiting, *self.running]:
            self.timings[r.request_id] = [*r.times, time.time()]
            r.out.put_nowait(error)
        self.waiting.clear()
        self.running.clear()
        if self._task is not None:
            self._task.cancel()
        self._write_stats()

    def _admit(self) -> None:
        for r in [r for r in self.waiting if r.aborted]:
            self.waiting.remove(r)
            r.out.put_nowait(output(None, finished=True, reason="abort"))
        while self.waiting:
            head, held = self.waiting[0], self.held()
            if any(h + n > c for h, n, c in
                   zip(held, self.need(head), self.capacity, strict=True)):
                break
            head.times.append(time.time())
            self.running.append(self.waiting.popleft())
        self.peak_seqs = max(self.peak_seqs, self.held()[0])

    def _write_stats(self) -> None:
        if not self.stats_file:
            return
        tmp = f"{self.stats_file}.tmp"
        Path(tmp).write_text(json.dumps({
            "peak_seqs": self.peak_seqs, "running_seqs": self.held()[0],
            "running": [r.request_id for r in self.running],
            "waiting": [r.request_id for r in self.waiting], "steps": self.steps,
            "requests": self.timings}))
        os.replace(tmp, self.stats_file)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = ([r.request_id for r in self.running], len(self.waiting))
            self._admit()
            if before != ([r.request_id for r in self.running], len(self.waiting)):
                self._write_stats()
            if not self.running:  # idle: the next request starts the loop again
                return
            if self.frozen:  # a broken engine (FAKE_OMNI_BREAK=stuck-cancel): no more steps
                await asyncio.sleep(HOLD_POLL_S)
                continue
            if self.hold_file and Path(self.hold_file).exists():
                self._abort_finished()
                await asyncio.sleep(HOLD_POLL_S)
                continue
            base, per_seq = self.cost_s
            await asyncio.sleep(base + per_seq * self.held()[0])
            self._step(loop.time())
            due = [r.next_at for r in self.running]
            if due and min(due) > loop.time():  # only slow requests, none due yet
                await asyncio.sleep(min(due) - loop.time())

    def _step(self, now: float) -> None:
        """One decode step: a frame for every running request that is due."""
        self.steps += 1
        for r in list(self.running):
            if r.aborted:
                self._finish(r, output(None, finished=True, reason="abort"))
            elif r.next_at <= now:
                r.done += 1
                r.next_at = now + r.frame_s
                made = r.emit(r.done, r.done >= r.frames) if r.done in r.boundaries else None
                if made is not None:
                    r.out.put_nowait(made)
                if r.done >= r.frames:
                    self._finish(r, None)

    def _abort_finished(self) -> None:
        for r in [r for r in self.running if r.aborted]:
            self._finish(r, output(None, finished=True, reason="abort"))

    def _finish(self, r: Running, last: Any) -> None:
        self.running.remove(r)
        self.timings[r.request_id] = [*r.times, time.time()]
        if last is not None:
            r.out.put_nowait(last)
        self._write_stats()


class FakeOmni:
    def __init__(self, model: str, deploy_config: str | None = None, **kwargs: Any) -> None:
        check_engine_stack(fake_stack())  # as the production factory does, first
        check_torch_build(fake_torch())
        if deploy_config is not None:
            check_visible(deploy_config, fake_visible_gpus(),
                          os.environ.get("CUDA_VISIBLE_DEVICES"))
        self.model = model
        self.deploy_config = deploy_config or "audex_tts.yaml"
        # vLLM-Omni's start-up bound (entrypoints/omni_base.py:181-182) against the load
        # time the test asks for (``load_s``): no waiting, the engine's own error
        self.init_timeout = kwargs.get("init_timeout", INIT_TIMEOUT_S)
        self.stage_init_timeout = kwargs.get("stage_init_timeout", STAGE_INIT_TIMEOUT_S)
        if float(kwargs.get("load_s", 0)) > self.init_timeout:  # omni_engine_base.py:528
            raise TimeoutError(f"Orchestrator did not become ready within {self.init_timeout}s")
        pipeline = src.deploy(self.deploy_config)["pipeline"]
        check_engine_kwargs(pipeline, _TOPOLOGIES[pipeline], kwargs)
        check_model_path(model, _TOPOLOGIES[pipeline])
        link_weights(model, _TOPOLOGIES[pipeline])
        stages = topology(self.deploy_config)
        self.stages = tuple(name for name, _, _ in stages)
        self.max_model_len = stage0_yaml(self.deploy_config).get("max_model_len")
        self.max_num_seqs = stage_max_num_seqs(self.deploy_config, kwargs)
        self.stage_configs = [SimpleNamespace(
            stage_pipeline_config=SimpleNamespace(model_stage=name),
            engine_args=SimpleNamespace(max_num_seqs=seqs))
            for name, seqs in zip(self.stages, self.max_num_seqs, strict=True)]
        self.default_sampling_params_list = default_params(self.deploy_config)
        self.kwargs = kwargs
        self.die_marker = kwargs.get("die_marker")
        self.hold_file, self.stats_file = kwargs.get("hold_file"), kwargs.get("stats_file")
        self.step_cost_s = step_cost(kwargs.get("step_cost_s"))
        self._scheduler: StepScheduler | None = None
        self.tokenizer = FakeTokenizer()
        self.requests: list[dict] = []
        self.aborted: list[str] = []
        self.emitted_samples = 0  # every sample handed out, copies included
        self.last_mp4: list[bytes] = []
        self.errored = False

    def shutdown(self, timeout: float | None = None) -> None:
        """AsyncOmni.shutdown (sync, on the engine's loop): takes ``shutdown_s`` (a stage
        that will not stop), then notes itself in ``shutdown_file`` for the tests."""
        time.sleep(float(self.kwargs.get("shutdown_s", 0)))
        if self.kwargs.get("shutdown_file"):
            with open(self.kwargs["shutdown_file"], "a") as f:
                f.write(f"{os.getpid()} shutdown\n")

    async def abort(self, request_id: str, *, timeout: float | None = None) -> None:
        self.aborted.append(request_id)
        if self._scheduler is not None:
            self._scheduler.abort(request_id)
            self._scheduler.frozen = BREAK == "stuck-cancel"

    @property
    def scheduler(self) -> StepScheduler:
        """The step loop, on the loop the engine is driven from (built on first use)."""
        if self._scheduler is None or not self._scheduler.alive():
            self._scheduler = StepScheduler(self.max_num_seqs, self.step_cost_s,
                                            self.hold_file, self.stats_file)
        return self._scheduler

    @property
    def peak_seqs(self) -> int:
        return self._scheduler.peak_seqs if self._scheduler is not None else 0

    @property
    def scheduler_steps(self) -> int:
        return self._scheduler.steps if self._scheduler is not None else 0

    async def generate(self, prompt: dict, sampling_params: Any = None, request_id: str = "",
                       *, sampling_params_list: list | None = None,
                       output_modalities: list[str] | None = None):
        arrived = time.time()  # the engine's own time starts here (its stats' "in")
        params = sampling_params_list or self.default_sampling_params_list
        self.requests.append({"prompt": prompt, "params": copy.deepcopy(params),
                              "request_id": request_id, "modalities": output_modalities})
        text = prompt.get("prompt") or ""
        if "[die]" in text and self.die_marker and not Path(self.die_marker).exists():
            Path(self.die_marker).touch()
            self.errored = True
            if self._scheduler is not None:
                self._scheduler.die(FakeEngineDeadError("EngineCore died"))
        if self.errored:  # a dead engine refuses every new request (vLLM's ``errored``)
            raise FakeEngineDeadError("EngineCore died")
        if "[guardrail]" in text:  # a 4xx-class refusal (vllm_omni/errors.py:37)
            raise GuardrailViolationError("Request rejected: the prompt violates the content "
                                          "policy of this deployment. " + "Details. " * 40)
        if self.stages[0] == "encoder":
            yield await self._video(params, prompt)
            return
        async for out in self._audio(text, params, request_id, arrived):
            self.emitted_samples += audio_samples(out.multimodal_output)
            yield out

    # ---- Audex -------------------------------------------------------------------------

    def _codes(self, text: str, stage0: SamplingParams, seconds: float) -> int:
        """Codec frames stage 0 emits: what the text needs, unless max_tokens or the
        context window (prompt + output <= max_model_len) stops it first."""
        limit = stage0.max_tokens if stage0.max_tokens is not None else 10**9
        if self.max_model_len is not None:
            limit = min(limit, self.max_model_len - len(self.tokenizer.encode(text)))
        return max(0, min(round(seconds * SR / HOP), limit))

    async def _audio(self, text: str, params: list, request_id: str, arrived: float):
        tta = self.stages[0] == "audex_tta_thinker"
        spoken = re.search(r"(?:transcription|caption)\.(.*?)<\|im_end\|>", text, re.S)
        words = len(re.findall(r"\w+", spoken.group(1) if spoken else text))
        per_word = 1.0 if "[drawl]" in text else 0.25
        seconds = min(TTA_CAP_S, 0.4 * words) if tta else per_word * words
        key = "model_outputs" if "[model_outputs]" in text else "audio"
        sr = [np.array(22050 if BREAK == "rate" else SR, dtype=np.int32)]
        if "[hang]" in text:
            await asyncio.sleep(30)
        if "[engine-abort]" in text:  # preempted by the engine, not by the caller
            yield output(None, finished=True, reason="abort")
            return
        if "[silent]" in text:  # zero codec tokens: an empty waveform on a finished output
            yield output({key: tensor([]), "sr": sr}, finished=True, reason="stop")
            return
        full = speech(self._codes(text, params[0], seconds) * HOP / SR, text)
        if BREAK == "silent":
            full = full * 0
        extra = params[0].extra_args or {}
        seqs = 2 if float(extra.get("cfg_scale") or 1.0) > 1.0 else 1  # the companion
        if tta:  # XCodec decodes the full payload once (audex_tta.yaml:4-6)
            frames = max(1, len(full) // HOP)
            request = Running(request_id, frames, [frames], seqs, lambda _d, _f: output(
                {key: full, "sr": sr}, finished=True, reason="stop"))
        else:
            request = self._speech_request(full, kind_name(params[-1].output_kind), key, sr,
                                           request_id, seqs, "[slow]" in text)
        request.times = [arrived]
        self.scheduler.submit(request)
        while True:
            out = await request.out.get()
            if isinstance(out, BaseException):
                raise out
            yield out
            if out.finished:
                return

    def _speech_request(self, full: np.ndarray, kind: str, key: str, sr: list,
                        request_id: str, seqs: int, slow: bool) -> Running:
        """Output shapes per RequestOutputKind (outputs/output_processor.py:208-240, 325-327:
        DELTA drains what it sent; other kinds consolidate the whole waveform), one output
        per two codec chunks."""
        chunks = codec_chunks(full) or [full]
        groups = [chunks[i:i + 2] for i in range(0, len(chunks), 2)]
        ends = np.cumsum([sum(len(c) for c in g) for g in groups]).tolist()
        boundaries = [max(1, -(-end // HOP)) for end in ends]  # the frame each group ends on
        by_frame = dict(zip(boundaries, range(len(groups)), strict=False))

        def emit(done: int, last: bool) -> SimpleNamespace | None:
            group = groups[by_frame[done]]
            if kind == "DELTA":
                payload = np.concatenate(group) if last else list(group)
            elif kind == "FINAL_ONLY" and not last:
                return None
            else:
                payload = full[:ends[by_frame[done]]].copy()
            return output({key: payload, "sr": sr}, finished=last,
                          reason="stop" if last else None)

        return Running(request_id, boundaries[-1], boundaries, seqs, emit,
                       frame_s=SLOW_FRAME_S if slow else 0.0)

    # ---- MiniMax-H3 --------------------------------------------------------------------

    async def _video(self, params: list, prompt: dict) -> SimpleNamespace:
        """pipeline_minimax_h3.py:2621-2691 (forward) and :352-396 (_minimax_h3_post_process)."""
        diffusion = [p for p in params if isinstance(p, DiffusionParams)]
        if len(diffusion) != 1:  # stage_input_processors/minimax_h3.py:22-33
            raise RuntimeError("MiniMax H3 encoding requires exactly one "
                               f"OmniDiffusionSamplingParams stage parameter, got {len(diffusion)}")
        gp = diffusion[0]
        if not prompt.get("prompt"):
            raise OmniClientError("MiniMax H3 requires a non-empty prompt")
        height, width, frames, _, audio_t = h3_shape("t2va", gp, None)
        seed = gp.seed if gp.seed is not None else H3_DEFAULT_SEED
        seeds = [seed + i for i in range(int(gp.num_outputs_per_prompt))]
        samples = audio_t * H3_RATE // H3_AUDIO_LATENT_HZ
        if "[slow]" in prompt["prompt"]:  # one answer, after every clip is rendered
            await asyncio.sleep(H3_SLOW_S_PER_FRAME * frames * len(seeds))
        meta = {"audio": {"sample_rate": H3_RATE}, "video": {"fps": H3_FPS}}
        clips = [self._frames(frames, height, width, s) for s in seeds]
        samples += decoder_edge(seed)  # one (B, 2, N) batch: the same length for every clip
        tracks = [self._audio_track(samples, s) for s in seeds]
        if gp.extra_args.get("preencode_mp4"):
            encoded = [mux_like_vllm_omni(c, t) for c, t in zip(clips, tracks, strict=True)]
            self.last_mp4 = encoded
            return output({"metadata": meta, "audio": [None] * len(seeds),
                           "audio_sample_rate": H3_RATE, "fps": H3_FPS},
                          finished=True, reason="stop", images=encoded)
        return output({"metadata": meta, "audio": np.stack(tracks), "audio_sample_rate": H3_RATE,
                       "fps": H3_FPS}, finished=True, reason="stop", images=clips)

    @staticmethod
    def _frames(frames: int, h: int, w: int, seed: int) -> np.ndarray:
        base = np.random.default_rng(seed).integers(0, 200, (1, h, w, 3), dtype=np.uint8)
        return base + (np.arange(frames, dtype=np.uint8) % 50)[:, None, None, None]

    @staticmethod
    def _audio_track(samples: int, seed: int) -> np.ndarray:
        t = np.arange(samples) / H3_RATE
        pitch = 220 + seed % 200
        return tensor(np.stack([0.3 * np.sin(2 * np.pi * pitch * t),
                                0.3 * np.sin(2 * np.pi * 1.5 * pitch * t)]))


def decoder_edge(seed: int) -> int:
    """Samples the fake H3 audio decoder adds (or drops) for a request's seed: within one
    latent."""
    return seed * 7919 % (2 * H3_DECODER_EDGE + 1) - H3_DECODER_EDGE


def mux_like_vllm_omni(frames: np.ndarray, audio: np.ndarray) -> bytes:
    """What vLLM-Omni's pre-encode path writes (diffusion/utils/media_utils.py:435-494,
    reached through ChunkedMP4Encoder with H3's codec options, pipeline_minimax_h3.py:2608):
    an in-memory MP4 without ``movflags``, so the index lands after the media data."""
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as container:
        video = container.add_stream("h264", rate=Fraction(H3_FPS))
        video.width, video.height = int(frames.shape[2]), int(frames.shape[1])
        video.pix_fmt = "yuv420p"
        video.options = {"crf": "18", "preset": "ultrafast", "threads": "0"}
        sound = container.add_stream("aac", rate=H3_RATE)
        sound.layout = "stereo"
        for rgb in frames:
            container.mux(video.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")))
        container.mux(video.encode())
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(audio), format="fltp",
                                           layout="stereo")
        frame.sample_rate, frame.pts, frame.time_base = H3_RATE, 0, Fraction(1, H3_RATE)
        container.mux(sound.encode(frame))
        container.mux(sound.encode())
    return buf.getvalue()


ENGINES: list[FakeOmni] = []


def make_engine(model: str, deploy_config: str | None = None, **kwargs: Any) -> FakeOmni:
    engine = FakeOmni(model, deploy_config, **kwargs)
    ENGINES.append(engine)
    return engine


class FakeTokenizer:
    """Special tokens, words and punctuation are one token each; codec tokens exist."""

    _pattern = re.compile(r"<[^<>]+>|\w+|[^\w\s]")

    def __init__(self, path: str | None = None) -> None:
        self.path = path

    def encode(self, text: str) -> list[int]:
        return [hash(t) % 100000 for t in self._pattern.findall(text)]

    def get_vocab(self) -> dict[str, int]:
        vocab = {"<audiogen_start>": 131073, "<audiogen_end>": 131074}
        vocab.update({f"<audiocodec_{i}>": 196613 + i for i in range(8192)})
        return vocab


def make_tokenizer(model: str, folder: str | None = None) -> FakeTokenizer:
    return FakeTokenizer(model if folder is None else f"{model}::{folder}")


class FakeAutoTokenizer:
    """Stands in for ``transformers.AutoTokenizer``: like the real one, it needs a folder
    that exists (after ``subfolder``) and holds a tokenizer."""

    loaded: list[str] = []

    @classmethod
    def from_pretrained(cls, path: str, subfolder: str | None = None, **_: Any) -> FakeTokenizer:
        folder = Path(path, subfolder or "")
        if not (folder / "tokenizer_config.json").is_file():
            raise OSError(f"Can't load tokenizer for '{folder}'")
        cls.loaded.append(str(folder))
        return FakeTokenizer(str(folder))
