"""Compare what an encoder produced with what we meant to produce."""

from __future__ import annotations

from ..core.errors import EncodingFailed
from .probe import AudioProbe
from .validate import rms

# Encoder priming and padding (AAC 1024-2048 samples, MP3 1152) plus a little slack.
PADDING_SAMPLES = 2048
SLACK_S = 0.05


def verify_encoded_audio(probe: AudioProbe, *, sample_rate: int, channels: int,
                         duration_s: float, silence_rms: float,
                         codecs: tuple[str, ...] | None = None) -> None:
    if codecs is not None and probe.codec not in codecs:
        raise EncodingFailed(f"encoded codec {probe.codec} is not one of {', '.join(codecs)}",
                             code="codec_mismatch")
    if probe.sample_rate != sample_rate:
        raise EncodingFailed(f"encoded sample rate {probe.sample_rate} != {sample_rate}")
    if probe.channels != channels:
        raise EncodingFailed(f"encoded channel count {probe.channels} != {channels}")
    tolerance = PADDING_SAMPLES / sample_rate + SLACK_S
    if abs(probe.duration_s - duration_s) > tolerance:
        raise EncodingFailed(f"encoded duration {probe.duration_s:.3f} s differs from "
                             f"{duration_s:.3f} s", code="duration_mismatch")
    if rms(probe.samples) < silence_rms:
        raise EncodingFailed("encoded audio decodes to silence", code="silent_audio")
