"""The pipeline contract: a light spec (importable by the API) and a runtime (worker only)."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from core.errors import ConfigurationError, InvalidRequest, clip
from core.jobs import JobKind
from media.audio import AudioMode
from media.validate import AudioBounds

OPENAI_VOICES = frozenset({"alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx",
                           "sage", "shimmer", "verse", "marin", "cedar"})


def queue_for(pipeline: str) -> str:
    """The broker queue of a pipeline: only workers serving it consume from it."""
    return "pipeline." + re.sub(r"[^A-Za-z0-9_.-]", "-", pipeline)


@dataclass(frozen=True)
class SpeechRequest:
    """A speech job's request as the worker sees it (already validated at submit)."""

    input: str
    voice: str | None = None
    response_format: str = "mp3"
    speed: float = 1.0
    instructions: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpeechRequest:
        known = {k: data[k] for k in ("input", "voice", "response_format", "speed",
                                      "instructions") if k in data}
        extra = {k: v for k, v in data.items() if k not in known}
        return cls(**known, extra=extra)


@dataclass(frozen=True)
class VideoRequest:
    """A video job's request as the worker sees it (validated at submit)."""

    prompt: str
    seconds: float
    width: int
    height: int
    fps: int
    n: int = 1
    seed: int | None = None
    negative_prompt: str | None = None
    generate_audio: bool = True
    guidance_scale: float | None = None

    @property
    def frames(self) -> int:
        return max(1, round(self.seconds * self.fps))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VideoRequest:
        width, height = (int(v) for v in data["size"].split("x"))
        return cls(prompt=data["prompt"], seconds=float(data["seconds"]), width=width,
                   height=height, fps=int(data["fps"]), n=int(data.get("n", 1)),
                   seed=data.get("seed"), negative_prompt=data.get("negative_prompt"),
                   generate_audio=bool(data.get("generate_audio", True)),
                   guidance_scale=data.get("guidance_scale"))


@dataclass
class VideoResult:
    """What a T2VA stage hands back, in any of the shapes vLLM-Omni produces.

    ``videos``: one (F, H, W, 3)-like array per output (or a (B, F, ...) batch);
    ``audio``: None, one (C, N) track, a (B, C, N) batch or a list with one entry per
    video; or ``mp4``: pre-encoded files (audio already inside, ``audio`` then None).
    """

    fps: float
    videos: Any = None
    audio: Any = None
    audio_sample_rate: int | None = None
    mp4: list[bytes] | None = None


RATIO_TOLERANCE = 0.02
# Letters, digits (numbers) and symbols: what a text-to-speech front end turns into sound.
# Whitespace, punctuation and invisible format characters alone become nothing.
_WORDLIKE = ("L", "N", "S")


def require_text(text: str, param: str) -> None:
    """Refuse text that would render nothing (" ", ".", "?!"): a clear 400 at submit
    rather than a stored job that fails with ``no_audio``."""
    if not any(unicodedata.category(ch)[0] in _WORDLIKE for ch in text):
        raise InvalidRequest(f"{param} has nothing to speak or render: it needs at least one "
                             "letter, digit or symbol", param=param, code="empty_input")


def named_ratio(width: int, height: int, ratios: tuple[tuple[int, int], ...]
                ) -> tuple[int, int] | None:
    """The listed aspect ratio ``width x height`` has (within 2 %), if any."""
    for w, h in ratios:
        if abs(width / max(height, 1) - w / h) <= RATIO_TOLERANCE * w / h:
            return w, h
    return None


@dataclass(frozen=True)
class VideoLimits:
    max_seconds: float = 20.0
    min_seconds: float = 0.0  # exclusive when 0
    max_width: int = 1920
    max_height: int = 1920
    max_fps: int = 60
    fixed_fps: int | None = None  # the only rate the model renders
    max_n: int = 4
    default_size: str = "448x256"
    default_seconds: float = 4.0
    default_fps: int = 24
    makes_audio: bool = True
    aspect_ratios: tuple[tuple[int, int], ...] | None = None  # None: any
    max_raw_bytes: int = 2 * 2**30  # n x frames x H x W x 3 held in memory for finalize
    # The engine's own grid, which finalize holds its output to: frame counts rounded up
    # to ``step * n + offset`` and width/height floored to a multiple of ``size_multiple``.
    frame_grid: tuple[int, int] | None = None
    size_multiple: int = 1
    random_seed: bool = False  # an unseeded job gets a random seed, recorded at submit
    # Request fields the model honours; one it does not is a 400 naming it, never ignored.
    accepts_negative_prompt: bool = False
    accepts_guidance_scale: bool = False
    # The model's pixel budget and the sizes it names itself: a size over max_pixels is
    # refused, and a canvas is accepted at its aspect ratio even where the model's own
    # rounding puts it outside the 2 % tolerance.
    max_pixels: int | None = None
    canvases: tuple[tuple[int, int], ...] = ()

    def size_problem(self, width: int, height: int) -> str | None:
        """Why the model cannot render ``width x height`` (None: it can)."""
        if (width, height) in self.canvases:
            return None
        sizes = ", ".join(f"{w}x{h}" for w, h in self.canvases)
        own = f"; its own sizes are {sizes}, and smaller ones at their aspect ratios" \
            if sizes else ""
        if self.max_pixels is not None and width * height > self.max_pixels:
            return f"size {width}x{height} is over the {self.max_pixels} pixels it renders{own}"
        if self.aspect_ratios is not None and named_ratio(width, height,
                                                          self.aspect_ratios) is None:
            ratios = ", ".join(f"{w}:{h}" for w, h in self.aspect_ratios)
            return f"size must have one of the aspect ratios {ratios}{own}"
        return None

    def rendered(self, req: VideoRequest) -> tuple[int, int, int]:
        """(frames, width, height) the model makes for ``req``."""
        frames = req.frames
        if self.frame_grid is not None:
            step, offset = self.frame_grid
            frames += (offset - frames) % step
        m = self.size_multiple
        return frames, req.width // m * m, req.height // m * m


@dataclass(frozen=True)
class PipelineSpec:
    """What a pipeline serves and accepts; everything the API needs to validate a job."""

    name: str
    kind: JobKind
    models: tuple[str, ...]
    description: str = ""
    audio_mode: AudioMode = "incremental"
    sample_rate: int | None = None
    channels: int = 1
    max_input_chars: int = 4096
    audio_bounds: AudioBounds = AudioBounds()
    voices: frozenset[str] | None = None  # None: the pipeline takes no voice at all
    supports_instructions: bool = False
    extra_fields: frozenset[str] = frozenset()  # pipeline-specific request fields accepted
    numeric_fields: tuple[tuple[str, float, float], ...] = ()  # (field, min, max), inclusive
    reserved_fields: frozenset[str] = frozenset()  # set by the service, never by callers
    supports_speed: bool = True
    video: VideoLimits | None = None
    # Longest a job may run (claim to completion) before it fails or retries with
    # ``timeout``; None: 900 s for speech, 3600 s for video. ``max_runtime_s`` in the
    # pipeline's OMNIJOBS_PIPELINE_OPTIONS entry overrides it.
    max_runtime_s: float | None = None

    @property
    def queue(self) -> str:
        return queue_for(self.name)

    @property
    def runtime_limit_s(self) -> float:
        if self.max_runtime_s is not None:
            return self.max_runtime_s
        return 3600.0 if self.kind is JobKind.VIDEO else 900.0

    def named(self, model: str | None) -> str:
        """The model as the caller named it. An alias's error must name the alias (not a
        model the caller never asked for) and say what serves it: that is why its limits
        apply."""
        model = model or self.models[0]
        if model in self.models or model == self.name:
            return f"'{clip(model)}'"
        return f"'{clip(model)}' (served here by {self.name}: {self.description})"

    def validate_speech(self, req: SpeechRequest, model: str | None = None) -> None:
        """Raise InvalidRequest for anything this pipeline cannot honour; ``model`` is the
        id the caller used (an alias, perhaps)."""
        if len(req.input) > self.max_input_chars:
            raise InvalidRequest(f"input is {len(req.input)} characters; {self.name} accepts "
                                 f"at most {self.max_input_chars}", param="input",
                                 code="input_too_long")
        require_text(req.input, "input")
        voice = (req.voice or "").strip()
        if voice and voice.lower() != "default" and (
                self.voices is None or voice.lower() not in self.voices):
            raise InvalidRequest(f"voice '{clip(voice)}' is not available for model "
                                 f"{self.named(model)}", param="voice",
                                 code="unsupported_voice")
        self._refuse_unsupported(model, (
            ("instructions", req.instructions and not self.supports_instructions),
            ("speed", req.speed != 1.0 and not self.supports_speed)))
        self._validate_extra(req.extra, model)

    def _refuse_unsupported(self, model: str | None,
                            fields: tuple[tuple[str, Any], ...]) -> None:
        """A field the model would ignore is a 400 naming it: silently dropping it would
        hand back something other than what was asked for."""
        for name, unsupported in fields:
            if unsupported:
                raise InvalidRequest(f"'{name}' is not supported by {self.named(model)}; "
                                     "leave it out", param=name, code="unsupported_parameter")

    def _validate_extra(self, extra: dict[str, Any], model: str | None) -> None:
        reserved = sorted(set(extra) & self.reserved_fields)
        if reserved:
            raise InvalidRequest(f"'{clip(reserved[0])}' is set by the service and may not be "
                                 "sent", param=clip(reserved[0]), code="reserved_parameter")
        for name, low, high in self.numeric_fields:
            if name in extra:
                value = extra[name]
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                        low <= value <= high):
                    raise InvalidRequest(f"{name} must be a number in [{low:g}, {high:g}] "
                                         f"(got {clip(value)})", param=name)
        unknown = set(extra) - self.extra_fields
        if unknown:
            name = sorted(unknown)[0]
            raise InvalidRequest(f"unrecognised parameter '{clip(name)}' for "
                                 f"{self.named(model)}", param=clip(name),
                                 code="unsupported_parameter")

    def validate_video(self, req: VideoRequest, model: str | None = None) -> None:
        """Raise InvalidRequest for a clip this pipeline cannot make."""
        lim = self.video
        if lim is None:
            raise InvalidRequest(f"{self.named(model)} does not generate video",
                                 param="model", code="unsupported_model")
        require_text(req.prompt, "prompt")
        self._refuse_unsupported(model, (
            ("negative_prompt", req.negative_prompt and not lim.accepts_negative_prompt),
            ("guidance_scale", req.guidance_scale is not None
             and not lim.accepts_guidance_scale)))
        frames, width, height = lim.rendered(req)
        problem = lim.size_problem(req.width, req.height)
        checks = [
            (lim.min_seconds <= req.seconds <= lim.max_seconds and req.seconds > 0, "seconds",
             f"seconds must be in [{lim.min_seconds:g}, {lim.max_seconds:g}]" if lim.min_seconds
             else f"seconds must be in (0, {lim.max_seconds:g}]"),
            (0 < req.width <= lim.max_width and 0 < req.height <= lim.max_height, "size",
             f"size must be at most {lim.max_width}x{lim.max_height}"),
            (problem is None, "size", f"{self.named(model)}: {problem}"),
            (width > 0 and height > 0, "size",
             f"width and height must be at least {lim.size_multiple}"),
            (req.width % 2 == 0 and req.height % 2 == 0, "size",
             "width and height must be even (H.264 yuv420p)"),
            (1 <= req.fps <= lim.max_fps, "fps", f"fps must be in [1, {lim.max_fps}]"),
            (lim.fixed_fps in (None, req.fps), "fps",
             f"{self.named(model)} renders at {lim.fixed_fps} fps only"),
            (1 <= req.n <= lim.max_n, "n", f"n must be in [1, {lim.max_n}]"),
            (lim.makes_audio or not req.generate_audio, "generate_audio",
             f"{self.named(model)} does not generate audio"),
            (req.n * frames * width * height * 3 <= lim.max_raw_bytes, "size",
             f"n x frames x size is too large: at most {lim.max_raw_bytes / 2**30:g} GiB "
             "of raw frames per job"),
        ]
        for ok, param, message in checks:
            if not ok:
                raise InvalidRequest(message, param=param)


@dataclass
class RunContext:
    """Given to a running pipeline: report progress, notice cancellation."""

    job_id: str
    report_progress: Callable[[float], None] = lambda _fraction: None
    is_cancelled: Callable[[], bool] = lambda: False


@dataclass(frozen=True)
class AudioPiece:
    samples: np.ndarray
    sample_rate: int


class Pipeline:
    """Base for backends. ``load`` runs once per worker process, before any job.

    ``options`` come from ``OMNIJOBS_PIPELINE_OPTIONS[<name>]`` (model path, deploy
    config, engine arguments); each backend documents the keys it reads.
    """

    spec: ClassVar[PipelineSpec]
    default_deploy: ClassVar[str | None] = None  # an engine pipeline's vLLM-Omni deploy

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        self.options = dict(options or {})

    @classmethod
    def deploy_config(cls, options: dict[str, Any]) -> str | None:
        """The deploy config these options build (the option, else the default): what
        decides the GPUs a worker of this pipeline needs (pipelines/devices.py)."""
        return options.get("deploy_config", cls.default_deploy)

    def load(self) -> None:
        """Import heavy libraries and load weights. Default: nothing to load."""

    def close(self, timeout_s: float) -> None:
        """Stop what ``load`` started, within ``timeout_s``: the process is exiting.
        Default: nothing runs beside the jobs."""

    def slots(self) -> int:
        """How many jobs a worker keeps in flight on this pipeline (after ``load``): the
        option ``slots``, else one. A CPU pipeline computes on the worker's own cores,
        where a second job at once only splits them; an engine that batches says more."""
        return positive_slots(self.options.get("slots", 1))

    def slot_weight(self, request: dict[str, Any]) -> int:
        """The slots one job of this request holds while it generates."""
        return 1

    def speech(self, request: SpeechRequest, ctx: RunContext) -> Iterator[AudioPiece]:
        raise NotImplementedError(f"{self.spec.name} does not generate speech")

    def video(self, request: VideoRequest, ctx: RunContext) -> VideoResult:
        raise NotImplementedError(f"{self.spec.name} does not generate video")


def positive_slots(value: Any) -> int:
    """The ``slots`` option: a whole number of at least one."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"the pipeline option slots must be a whole number of at "
                                 f"least 1, not {value!r}")
    return value
