"""validate_audio: empty, non-finite, rate, duration bounds, silence floor, stats."""

from __future__ import annotations

import numpy as np
import pytest

from core.errors import OutputInvalid
from media.audio import Audio
from media.validate import DEFAULT_SILENCE_RMS, AudioBounds, rms, validate_audio

SR = 16000
BOUNDS = AudioBounds(min_s=0.05, max_s=10.0)


def sine_audio(seconds: float, *, amp: float = 0.5, freq: float = 440.0, sr: int = SR,
               channels: int = 1) -> Audio:
    t = np.arange(int(round(seconds * sr)), dtype=np.float64) / sr
    x = (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)
    return Audio(samples=np.tile(x, (channels, 1)), sample_rate=sr)


def code_of(audio: Audio, *, expected: int | None = SR, bounds: AudioBounds = BOUNDS) -> str:
    with pytest.raises(OutputInvalid) as info:
        validate_audio(audio, expected_sample_rate=expected, bounds=bounds)
    return info.value.code


def test_empty_audio_is_no_audio() -> None:
    audio = Audio(samples=np.zeros((1, 0), dtype=np.float32), sample_rate=SR)
    assert code_of(audio) == "no_audio"


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_samples_are_rejected(bad: float) -> None:
    audio = sine_audio(0.5)
    audio.samples[0, 1234] = bad
    assert code_of(audio) == "audio_not_finite"


def test_sample_rate_mismatch() -> None:
    assert code_of(sine_audio(0.5, sr=22050), expected=SR) == "sample_rate_mismatch"


def test_no_declared_rate_skips_the_rate_check() -> None:
    stats = validate_audio(sine_audio(0.5, sr=22050), expected_sample_rate=None, bounds=BOUNDS)
    assert stats.duration_s == pytest.approx(0.5)


def test_too_short_is_out_of_bounds() -> None:
    assert code_of(sine_audio(0.02)) == "duration_out_of_bounds"


def test_too_long_is_out_of_bounds() -> None:
    bounds = AudioBounds(min_s=0.05, max_s=1.0)
    assert code_of(sine_audio(1.5), bounds=bounds) == "duration_out_of_bounds"


def test_duration_bounds_are_inclusive() -> None:
    bounds = AudioBounds(min_s=0.05, max_s=1.0)
    low = validate_audio(sine_audio(0.05, sr=1000, freq=50.0), expected_sample_rate=1000,
                         bounds=bounds)
    high = validate_audio(sine_audio(1.0), expected_sample_rate=SR, bounds=bounds)
    assert low.duration_s == pytest.approx(0.05)
    assert high.duration_s == pytest.approx(1.0)


def test_digital_silence_is_rejected() -> None:
    audio = Audio(samples=np.zeros((1, SR), dtype=np.float32), sample_rate=SR)
    assert code_of(audio) == "silent_audio"


def test_quiet_noise_below_the_floor_is_rejected() -> None:
    rng = np.random.default_rng(1234)
    noise = (1e-4 * rng.standard_normal((2, SR))).astype(np.float32)  # about -80 dBFS
    assert rms(noise) < DEFAULT_SILENCE_RMS
    assert code_of(Audio(samples=noise, sample_rate=SR)) == "silent_audio"


def test_silence_floor_comes_from_bounds() -> None:
    strict = AudioBounds(min_s=0.05, max_s=10.0, silence_rms=0.5)
    assert code_of(sine_audio(0.5, amp=0.5), bounds=strict) == "silent_audio"


def test_quiet_but_real_audio_passes() -> None:
    stats = validate_audio(sine_audio(0.5, amp=0.005), expected_sample_rate=SR, bounds=BOUNDS)
    assert stats.rms == pytest.approx(0.005 / np.sqrt(2), rel=1e-3)


@pytest.mark.parametrize("channels", [1, 2])
def test_real_sine_passes_with_analytic_stats(channels: int) -> None:
    stats = validate_audio(sine_audio(2.0, channels=channels), expected_sample_rate=SR,
                           bounds=BOUNDS)
    assert stats.duration_s == pytest.approx(2.0)
    assert stats.rms == pytest.approx(0.5 / np.sqrt(2), rel=1e-3)  # ~0.3536
    assert stats.rms == pytest.approx(0.3536, abs=1e-3)
    assert stats.peak == pytest.approx(0.5, abs=1e-3)


def test_rms_helper() -> None:
    assert rms(np.zeros(0, dtype=np.float32)) == 0.0
    assert rms(np.full(100, -0.25, dtype=np.float32)) == pytest.approx(0.25)
