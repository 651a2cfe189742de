"""Text-to-video-with-audio diffusion models (MiniMax-H3 class) through vLLM-Omni.

Options (``OMNIJOBS_PIPELINE_OPTIONS[<name>]``): ``model``, ``deploy_config`` (default
``minimax_h3_disaggregated.yaml``), ``engine_kwargs``, ``engine_factory``, and
``preencode_mp4`` (ask the engine for finished MP4s; they are probed and uploaded
without re-encoding). The request becomes a prompt plus a deep copy of the engine's
diffusion sampling defaults; the output (frames, (B, C, N) audio, fps, audio sample
rate, or pre-encoded MP4 bytes with ``audio: [None]``) goes to the shared video
finalize path.

MiniMax-H3's contract, as vllm-omni 0.30.0 enforces it in
``model_executor/models/minimax_h3/encoder_processing.py:145-211`` (``resolve_minimax_h3_shape``):
fps is fixed at 24 (:156-158, any other rate is an ``OmniClientError``), the duration
must be 4-15 s (:45-47, :174-182), a text-to-video request must name its aspect ratio
(``preprocessing.py:105-107``), frame counts are rounded up to 17n+5
(``diffusion/models/minimax_h3/time_request.py:10-17``) and width/height floored to a
multiple of 32 (:199-200; decode crops to it, pipeline_minimax_h3.py:2094). We reject
what the engine would refuse at submit, accept its grid, and record what it made.
Those modules import torch, so the constants are copied here (the API validates without
vllm-omni); tests pin them against vllm-omni's source.

What H3 does not honour is refused at submit, never passed on to be ignored: it is
CFG-distilled with no negative branch (pipeline_minimax_h3.py:837), so
``negative_prompt`` is a 400, and so is ``guidance_scale`` (only FastH3 reads it, to
refuse anything but 1, fasth3_checkpoint.py:130-131). H3 always renders its audio (only
Cosmos3 reads ``generate_sound``, pipeline_cosmos3.py:1796), so ``generate_audio: false``
is honoured in finalize: the track is left out, of a pre-encoded MP4 too.

Sizes: explicit width and height skip H3's canvas policy (short edge 768, area capped at
768x1344, preprocessing.py:35-36, :152-169), so the spec holds a size to that area
itself, and accepts the policy's own canvases (1536x672 is 21:9 to the engine, though
2 % off it).

The engine answers once, when all ``n`` clips are rendered, so the silence that counts
as a hung engine (option ``request_timeout_s``, default 1800 s) is per clip of up to 5 s
and grows with ``n`` and with the rendered length.
"""

from __future__ import annotations

import uuid
from typing import Any

from core.errors import PipelineFailed
from core.jobs import JobKind

from .base import (
    Pipeline,
    PipelineSpec,
    RunContext,
    VideoLimits,
    VideoRequest,
    VideoResult,
    named_ratio,
)
from .omni_bridge import (
    OmniBridge,
    import_object,
    scalar,
    startup_kwargs,
    to_array,
    to_numpy,
)
from .registry import register_pipeline
from .weights import check_modules_cache, check_reachable

ENGINE_FACTORY = "pipelines.omni_bridge:build_async_omni"
# MINIMAX_H3_SUPPORTED_ASPECT_RATIOS, model_executor/models/minimax_h3/preprocessing.py:39-46
H3_RATIOS = ((21, 9), (16, 9), (4, 3), (1, 1), (3, 4), (9, 16))
H3_FPS = 24  # MINIMAX_H3_FPS, encoder_processing.py:45
H3_MIN_S, H3_MAX_S = 4.0, 15.0  # encoder_processing.py:46-47 (long_video.py:29 without long_video)
H3_FRAME_GRID = (17, 5)  # time_request.py:10-17
H3_SIZE_MULTIPLE = 32  # encoder_processing.py:199-200
# MINIMAX_H3_OUTPUT_SHORT_EDGE and _MAX_PIXELS, preprocessing.py:35-36
H3_SHORT_EDGE, H3_MAX_PIXELS = 768, 768 * 1344
TIMEOUT_CLIP_S = 5.0  # request_timeout_s covers one clip up to this long


def h3_canvas(ratio: tuple[int, int]) -> tuple[int, int]:
    """(width, height) of H3's canvas for a named ratio, as its policy computes it
    (``resolve_minimax_h3_output_canvas``, preprocessing.py:152-169)."""
    aspect = ratio[0] / ratio[1]
    width, height = ((H3_SHORT_EDGE * aspect, float(H3_SHORT_EDGE)) if aspect >= 1.0
                     else (float(H3_SHORT_EDGE), H3_SHORT_EDGE / aspect))
    if width * height > H3_MAX_PIXELS:
        scale = (H3_MAX_PIXELS / (width * height)) ** 0.5
        width, height = width * scale, height * scale
    return tuple(max(32, int(round(v / 32)) * 32) for v in (width, height))


H3_CANVASES = {h3_canvas(ratio): ratio for ratio in H3_RATIOS}


def diffusion_params(params: list[Any]) -> Any:
    """The stage's diffusion sampling params (the one with ``num_outputs_per_prompt``)."""
    for p in params:
        if hasattr(p, "num_outputs_per_prompt"):
            return p
    raise PipelineFailed("engine has no diffusion stage", retryable=False)


def aspect_ratio(width: int, height: int) -> str:
    """The named ratio H3 needs (``"16:9"``); validation at submit guarantees one."""
    ratio = H3_CANVASES.get((width, height)) or named_ratio(width, height, H3_RATIOS)
    if ratio is None:
        raise PipelineFailed(f"{width}x{height} has no supported aspect ratio", retryable=False)
    return f"{ratio[0]}:{ratio[1]}"


def apply_request(gp: Any, request: VideoRequest, preencode: bool) -> None:
    """As vLLM-Omni's video endpoint maps a request (entrypoints/openai/serving_video.py:
    386-396, 403-405, 425-426); the explicit ``aspect_ratio`` is what H3 requires. What H3
    ignores (guidance, a negative prompt, ``generate_sound``) is not sent."""
    gp.width, gp.height = request.width, request.height
    gp.num_frames = request.frames
    gp.fps, gp.frame_rate = request.fps, float(request.fps)
    gp.num_outputs_per_prompt = request.n
    if request.seed is not None:  # else the deploy's seed (42) for every job
        gp.seed = request.seed
    gp.extra_args = dict(getattr(gp, "extra_args", None) or {})
    gp.extra_args.update(duration=float(request.seconds),
                         aspect_ratio=aspect_ratio(request.width, request.height))
    if preencode:
        gp.extra_args["preencode_mp4"] = True


def _first(mapping: Any, *keys: str) -> Any:
    for key in keys:
        value = mapping.get(key) if mapping else None
        if value is not None:
            return value
    return None


def video_result(out: Any, request: VideoRequest) -> VideoResult:
    """Read frames/audio/fps/rate the way vLLM-Omni's video server does."""
    mm = out.multimodal_output or {}
    meta = mm.get("metadata") or {}
    images = getattr(out, "images", None)
    if images is None or len(images) == 0:
        images = mm.get("video")
    if images is None or len(images) == 0:
        raise PipelineFailed("engine returned no video", retryable=False)
    fps = scalar(_first(mm, "fps") or (meta.get("video") or {}).get("fps")) or request.fps
    rate = scalar(_first(mm, "audio_sample_rate", "sample_rate", "sampling_rate", "sr")
                  or (meta.get("audio") or {}).get("sample_rate"))
    audio = mm.get("audio")
    if isinstance(audio, (list, tuple)):
        audio = [None if a is None else to_numpy(a) for a in audio]
    elif audio is not None:
        audio = to_numpy(audio)
    if isinstance(images, (list, tuple)) and all(isinstance(v, (bytes, bytearray))
                                                 for v in images):
        return VideoResult(fps=float(fps), mp4=[bytes(v) for v in images], audio=audio,
                           audio_sample_rate=rate)
    videos = to_array(images) if hasattr(images, "shape") else [to_array(v) for v in images]
    return VideoResult(fps=float(fps), videos=videos, audio=audio, audio_sample_rate=rate)


@register_pipeline
class MiniMaxH3(Pipeline):
    spec = PipelineSpec(
        name="minimax-h3", kind=JobKind.VIDEO, models=("MiniMaxAI/MiniMax-H3", "minimax-h3"),
        description="MiniMax-H3 text-to-video-with-audio on vLLM-Omni (GPU)",
        sample_rate=32000, channels=2, max_input_chars=4000,
        video=VideoLimits(min_seconds=H3_MIN_S, max_seconds=H3_MAX_S, max_width=1920,
                          max_height=1920, max_fps=H3_FPS, fixed_fps=H3_FPS, max_n=4,
                          default_size="1280x720", default_seconds=5.0, default_fps=H3_FPS,
                          makes_audio=True, aspect_ratios=H3_RATIOS, frame_grid=H3_FRAME_GRID,
                          size_multiple=H3_SIZE_MULTIPLE, random_seed=True,
                          max_pixels=H3_MAX_PIXELS, canvases=tuple(H3_CANVASES)))

    default_deploy = "minimax_h3_disaggregated.yaml"
    # init_timeout and stage_init_timeout: six GPUs' weights and CUDA-graph capture
    start_timeouts_s = (3600.0, 1800.0)

    # The smallest request the engine accepts: the worker proves its engine before jobs.
    WARM_UP = VideoRequest(prompt="warm up", seconds=H3_MIN_S, width=448, height=256,
                           fps=H3_FPS, seed=0)

    def load(self) -> None:
        model = self.options.get("model", self.spec.models[0])
        deploy = self.deploy_config(self.options)
        check_reachable(model, self.spec.name)
        check_modules_cache()  # its VAEs are remote code, written there at every start
        factory = import_object(self.options.get("engine_factory", ENGINE_FACTORY))
        kwargs = startup_kwargs(self.options, *self.start_timeouts_s)
        self._bridge = OmniBridge(lambda: factory(model, deploy, **kwargs))
        self._preencode = bool(self.options.get("preencode_mp4", False))
        self.video(self.WARM_UP, RunContext(job_id="warmup"))

    def close(self, timeout_s: float) -> None:
        self._bridge.close(timeout_s)

    def timeout_s(self, request: VideoRequest) -> float:
        """The engine's longest silence before it counts as hung: it answers once, when
        all ``n`` clips are rendered, so ``request_timeout_s`` (per clip of up to 5 s)
        grows with ``n`` and with the length the engine renders."""
        frames, _, _ = self.spec.video.rendered(request)
        clips = request.n * max(1.0, frames / H3_FPS / TIMEOUT_CLIP_S)
        return float(self.options.get("request_timeout_s", 1800)) * clips

    def video(self, request: VideoRequest, ctx: RunContext) -> VideoResult:
        params = self._bridge.default_params()
        apply_request(diffusion_params(params), request, self._preencode)
        prompt: dict[str, Any] = {"prompt": request.prompt, "modalities": ["video"]}
        request_id = f"{ctx.job_id}-{uuid.uuid4().hex[:8]}"
        last = None
        for out in self._bridge.stream(prompt, params, request_id, ctx.is_cancelled,
                                       timeout_s=self.timeout_s(request)):
            last = out  # only the final output matters; drop the rest as they come
        if last is None:
            raise PipelineFailed("engine finished without output")
        ctx.report_progress(1.0)
        return video_result(last, request)
