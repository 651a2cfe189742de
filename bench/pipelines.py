"""Benchmark-only pipelines, loaded by workers through OMNIJOBS_PIPELINE_MODULES."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import numpy as np

from core.jobs import JobKind
from pipelines import Pipeline, PipelineSpec, VideoLimits, VideoResult, register_pipeline
from pipelines.base import OPENAI_VOICES, AudioPiece
from pipelines.reference_t2va import render_frames

GPU_SECONDS = float(os.environ.get("BENCH_GPU_SECONDS", "2.15"))
SECONDS, WIDTH, HEIGHT, FPS, AUDIO_RATE = 10.125, 448, 256, 24, 32000


def synthetic_clip(seed: int = 0) -> VideoResult:
    frames = render_frames("a fast T2VA model's clip", seed, round(SECONDS * FPS), HEIGHT, WIDTH)
    t = np.arange(round(SECONDS * AUDIO_RATE)) / AUDIO_RATE
    left = 0.3 * np.sin(2 * np.pi * 220 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 0.5 * t))
    right = 0.3 * np.sin(2 * np.pi * 330 * t)
    audio = np.stack([left, right]).astype(np.float32)[None]
    return VideoResult(fps=FPS, videos=frames[None], audio=audio, audio_sample_rate=AUDIO_RATE)


@register_pipeline
class SleepingT2VA(Pipeline):
    """Holds the "GPU" for GPU_SECONDS (a sleep: the CPU is free, as while a GPU works)
    and returns a 10.125 s 448x256 24 fps clip with 32 kHz stereo audio."""

    spec = PipelineSpec(name="bench-t2va", kind=JobKind.VIDEO, models=("bench-t2va",),
                        video=VideoLimits(default_size=f"{WIDTH}x{HEIGHT}",
                                          default_seconds=SECONDS, default_fps=FPS))

    def load(self) -> None:
        self._clip = synthetic_clip()

    def video(self, request, ctx) -> VideoResult:
        time.sleep(GPU_SECONDS)
        ctx.report_progress(1.0)
        clip = self._clip
        return VideoResult(fps=clip.fps, videos=clip.videos.copy(), audio=clip.audio.copy(),
                           audio_sample_rate=clip.audio_sample_rate)


CLIP_SECONDS, CLIP_RATE = 2.0, 16000


def fixed_clip() -> np.ndarray:
    """2 s of a 440 Hz tone at 16 kHz, mono float32: loud enough to pass validation."""
    t = np.arange(round(CLIP_SECONDS * CLIP_RATE)) / CLIP_RATE
    return (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


@register_pipeline
class FixedClip(Pipeline):
    """Returns the same 2 s 16 kHz clip at once: a job then costs only the worker's own
    work (claim, aggregate, validate, encode, verify, upload, record)."""

    spec = PipelineSpec(name="bench-clip", kind=JobKind.SPEECH, models=("bench-clip",),
                        audio_mode="incremental", sample_rate=CLIP_RATE, channels=1,
                        voices=OPENAI_VOICES)

    def load(self) -> None:
        self._clip = fixed_clip()

    def speech(self, request, ctx) -> Iterator[AudioPiece]:
        yield AudioPiece(self._clip, CLIP_RATE)
