"""Audio checks before encoding. A silent or broken result is a failure, never a success."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from core.errors import OutputInvalid

from .audio import Audio

# -60 dBFS: quieter than any real speech, louder than dither or denormal noise.
DEFAULT_SILENCE_RMS = 1e-3


@dataclass(frozen=True)
class AudioBounds:
    min_s: float = 0.05
    max_s: float = 600.0
    silence_rms: float = DEFAULT_SILENCE_RMS


@dataclass(frozen=True)
class AudioStats:
    duration_s: float
    rms: float
    peak: float


def rms(samples: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(samples, dtype=np.float64)))) if samples.size else 0.0


def validate_audio(audio: Audio, *, expected_sample_rate: int | None,
                   bounds: AudioBounds) -> AudioStats:
    if audio.sample_rate <= 0:
        raise OutputInvalid(f"invalid sample rate {audio.sample_rate}",
                            code="sample_rate_invalid")
    if audio.frames == 0:
        raise OutputInvalid("no audio generated", code="no_audio")
    if not np.isfinite(audio.samples).all():
        raise OutputInvalid("audio contains NaN or infinite samples", code="audio_not_finite")
    if expected_sample_rate is not None and audio.sample_rate != expected_sample_rate:
        raise OutputInvalid(f"sample rate {audio.sample_rate} differs from the declared "
                            f"{expected_sample_rate}", code="sample_rate_mismatch")
    duration = audio.duration_s
    if not bounds.min_s <= duration <= bounds.max_s:
        raise OutputInvalid(f"audio lasts {duration:.3f} s, outside [{bounds.min_s}, "
                            f"{bounds.max_s}] s", code="duration_out_of_bounds")
    level = rms(audio.samples)
    if level < bounds.silence_rms:
        raise OutputInvalid(f"audio is silent (RMS {level:.2e} below the floor "
                            f"{bounds.silence_rms:.0e})", code="silent_audio")
    return AudioStats(duration_s=duration, rms=level, peak=float(np.abs(audio.samples).max()))
