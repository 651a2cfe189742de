"""CPU reference text-to-video-with-audio: a stand-in for a T2VA diffusion model.

It renders frames from the prompt (colours and motion derived from the prompt and the
seed, so the same request gives the same clip) and narrates the prompt with the
Piper voice, fitted to the clip's length. It returns what vLLM-Omni's T2VA stage
returns: a (B, F, H, W, 3) uint8 batch, (B, C, N) float audio, fps and the audio
sample rate, so the real muxing and validation path runs on any machine.
"""

from __future__ import annotations

import hashlib

import numpy as np

from core.errors import JobCancelled
from core.jobs import JobKind
from media.audio import Audio, AudioAggregator

from .base import (
    Pipeline,
    PipelineSpec,
    RunContext,
    SpeechRequest,
    VideoLimits,
    VideoRequest,
    VideoResult,
)
from .registry import register_pipeline

FRAME_BATCH = 24


def palette(prompt: str, seed: int) -> np.ndarray:
    digest = hashlib.sha256(f"{seed}:{prompt}".encode()).digest()
    return np.frombuffer(digest[:9], dtype=np.uint8).reshape(3, 3).astype(np.float32)


def render_frames(prompt: str, seed: int, frames: int, height: int, width: int,
                  start: int = 0) -> np.ndarray:
    """Frames [start, start + frames): a drifting gradient with a moving square."""
    colours = palette(prompt, seed)
    t = (np.arange(start, start + frames, dtype=np.float32) / 48.0)[:, None, None]
    y = np.linspace(0, 1, height, dtype=np.float32)[None, :, None]
    x = np.linspace(0, 1, width, dtype=np.float32)[None, None, :]
    wave = 0.5 + 0.5 * np.sin(2 * np.pi * (x + y + t))
    out = np.empty((frames, height, width, 3), dtype=np.uint8)
    for c in range(3):
        out[..., c] = (colours[0, c] * wave + colours[1, c] * (1 - wave)).astype(np.uint8)
    side = max(2, min(height, width) // 5)
    for i in range(frames):
        phase = (start + i) / 48.0 + seed % 7
        top = int((height - side) * (0.5 + 0.5 * np.sin(phase)))
        left = int((width - side) * (0.5 + 0.5 * np.cos(phase * 0.7)))
        out[i, top:top + side, left:left + side] = colours[2]
    return out


def fit_length(samples: np.ndarray, length: int, sample_rate: int) -> np.ndarray:
    """Pad with silence or cut (with a 20 ms fade) to exactly ``length`` samples."""
    if samples.shape[-1] >= length:
        out = samples[..., :length].copy()
        fade = min(length, sample_rate // 50)
        out[..., length - fade:] *= np.linspace(1, 0, fade, dtype=np.float32)
        return out
    return np.pad(samples, [(0, 0)] * (samples.ndim - 1) + [(0, length - samples.shape[-1])])


@register_pipeline
class ReferenceT2VA(Pipeline):
    spec = PipelineSpec(
        name="reference-t2va",
        kind=JobKind.VIDEO,
        models=("omnijobs/reference-t2va", "reference-t2va"),
        description="CPU stand-in for a T2VA model: procedural frames + Piper narration",
        sample_rate=22050,
        channels=2,
        max_input_chars=2000,
        video=VideoLimits(max_seconds=20.0, max_width=1280, max_height=1280, max_fps=60,
                          max_n=4, default_size="448x256", default_seconds=4.0,
                          default_fps=24, makes_audio=True),
    )

    def load(self) -> None:
        from .piper_tts import PiperJoe

        self._narrator = PiperJoe()
        self._narrator.load()

    def speak(self, text: str, speed: float = 1.0) -> Audio:
        """The narrator's own speech path (chunks aggregated as for a speech job)."""
        aggregator = AudioAggregator(self._narrator.spec.audio_mode)
        for piece in self._narrator.speech(SpeechRequest(input=text, speed=speed),
                                           RunContext(job_id="narration")):
            aggregator.add(piece.samples, piece.sample_rate)
        return aggregator.result()

    def narrate(self, text: str, seconds: float) -> tuple[np.ndarray, int]:
        speech = self.speak(text)
        if speech.duration_s > seconds:  # too long: speak faster, then cut what remains
            speech = self.speak(text, speed=min(4.0, speech.duration_s / seconds))
        rate = speech.sample_rate
        mono = fit_length(speech.samples[0], round(seconds * rate), rate)
        return np.stack([mono, mono]), rate

    def video(self, request: VideoRequest, ctx: RunContext) -> VideoResult:
        seed = request.seed if request.seed is not None else 0
        total = request.frames
        batch = np.empty((request.n, total, request.height, request.width, 3), np.uint8)
        for index in range(request.n):
            for start in range(0, total, FRAME_BATCH):
                if ctx.is_cancelled():
                    raise JobCancelled("job was cancelled")
                count = min(FRAME_BATCH, total - start)
                batch[index, start:start + count] = render_frames(
                    request.prompt, seed + index, count, request.height, request.width, start)
                ctx.report_progress(0.8 * (index * total + start + count)
                                    / (request.n * total))
        if not request.generate_audio:
            return VideoResult(fps=float(request.fps), videos=batch)
        track, rate = self.narrate(request.prompt, total / request.fps)
        ctx.report_progress(1.0)
        return VideoResult(fps=float(request.fps), videos=batch,
                           audio=np.stack([track] * request.n), audio_sample_rate=rate)
