"""Compare what an encoder produced with what we meant to produce."""

from __future__ import annotations

from core.errors import EncodingFailed

from .probe import AudioProbe, VideoProbe
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


def verify_encoded_video(probe: VideoProbe, *, frames: int, fps: int, width: int, height: int,
                         audio_s: float | None, sample_rate: int | None,
                         channels: int | None, silence_rms: float) -> None:
    """The muxed file must hold what was generated, audio included when there was audio."""
    check_container(probe)
    if probe.frames != frames:
        raise EncodingFailed(f"muxed {probe.frames} frames, generated {frames}",
                             code="frame_count_mismatch")
    if (probe.width, probe.height) != (width, height):
        raise EncodingFailed(f"muxed size {probe.width}x{probe.height}, expected "
                             f"{width}x{height}", code="size_mismatch")
    if round(probe.fps) != fps:
        raise EncodingFailed(f"muxed fps {probe.fps:.3f}, expected {fps}", code="fps_mismatch")
    if audio_s is None:
        return
    if probe.audio is None:
        raise EncodingFailed("the muxed file lost its audio track", code="audio_missing")
    verify_encoded_audio(probe.audio, sample_rate=sample_rate, channels=channels,
                         duration_s=audio_s, silence_rms=silence_rms)
    check_encoded_sync(probe)


def check_container(probe: VideoProbe) -> None:
    """What every MP4 we hand out must be: H.264 yuv420p (+ AAC), index first."""
    if probe.video_codec != "h264" or probe.pix_fmt not in (None, "yuv420p"):
        raise EncodingFailed(f"video is {probe.video_codec}/{probe.pix_fmt}, expected "
                             "h264/yuv420p", code="codec_mismatch")
    if probe.audio is not None and probe.audio.codec not in ("aac", "aac_fixed"):
        raise EncodingFailed(f"audio codec is {probe.audio.codec}, expected aac",
                             code="codec_mismatch")
    if not probe.faststart:
        raise EncodingFailed("the MP4 index is not at the front (no faststart)",
                             code="not_faststart")


def check_encoded_sync(probe: VideoProbe) -> None:
    """Encoded audio carries codec priming and padding, so the A/V tolerance of a file
    is one frame plus that padding (plus a little slack)."""
    if probe.audio is None or not probe.fps:
        return
    tolerance = 1 / probe.fps + PADDING_SAMPLES / probe.audio.sample_rate + SLACK_S
    if abs(probe.duration_s - probe.audio.duration_s) > tolerance:
        raise EncodingFailed(f"video lasts {probe.duration_s:.3f} s but its audio "
                             f"{probe.audio.duration_s:.3f} s", code="av_duration_mismatch")
