"""Video assembly rules, checked before anything is encoded.

Each rule exists because a real system got it wrong: fps given as 23.976 or NaN,
channel-first frames muxed as garbage, one audio track silently paired with the wrong
video of a batch, a 2x duration from a stereo track read as mono.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from core.errors import OutputInvalid, clip

from .audio import MAX_CHANNELS, to_channel_first


def coerce_fps(fps: float) -> int:
    """Round to an integer rate (23.976 -> 24); reject 0, negatives, NaN and inf."""
    try:
        value = float(fps)
    except (TypeError, ValueError):
        raise OutputInvalid(f"fps {clip(fps)} is not a number", code="fps_invalid") from None
    if not math.isfinite(value) or round(value) <= 0:
        raise OutputInvalid(f"fps {value} is not a positive finite rate", code="fps_invalid")
    return int(round(value))


def to_fhwc(frames: np.ndarray) -> np.ndarray:
    """Normalise a clip to uint8 (F, H, W, 3).

    Accepts FHWC, FCHW and CFHW. The channel axis is the one of size 3 among those
    positions; if several qualify the layout is ambiguous and rejected rather than
    guessed. Floats are taken as [0, 1].
    """
    arr = np.asarray(frames)
    if arr.ndim != 4:
        raise OutputInvalid(f"video frames must be 4-D, got shape {arr.shape}",
                            code="video_layout_invalid")
    candidates = [axis for axis in (3, 1, 0) if arr.shape[axis] == 3]
    if len(candidates) != 1:
        reason = "ambiguous" if candidates else "has no 3-channel axis"
        raise OutputInvalid(f"video frame layout {arr.shape} is {reason}",
                            code="video_layout_ambiguous" if candidates
                            else "video_layout_invalid")
    axis = candidates[0]
    if axis == 1:
        arr = arr.transpose(0, 2, 3, 1)
    elif axis == 0:
        arr = arr.transpose(1, 2, 3, 0)
    if np.issubdtype(arr.dtype, np.integer) and arr.dtype != np.uint8:
        if arr.size and (arr.min() < 0 or arr.max() > 255):
            raise OutputInvalid(f"{arr.dtype} pixel values outside 0..255",
                                code="video_pixel_range")
        arr = arr.astype(np.uint8)
    elif arr.dtype != np.uint8:
        if not np.isfinite(arr).all():
            raise OutputInvalid("video frames contain NaN or inf", code="video_not_finite")
        arr = (np.clip(arr, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
    if arr.shape[0] == 0:
        raise OutputInvalid("video has no frames", code="no_frames")
    return np.ascontiguousarray(arr)


def even_size(frames: np.ndarray) -> np.ndarray:
    """yuv420p needs even width and height: pad one edge row/column by replication."""
    _, h, w, _ = frames.shape
    if h % 2 == 0 and w % 2 == 0:
        return frames
    return np.pad(frames, ((0, 0), (0, h % 2), (0, w % 2), (0, 0)), mode="edge")


def pair_audio(audio, n_videos: int) -> list[np.ndarray | None]:
    """One audio track (C, N) or None per video, or an error; never a guess.

    - None, or a list of Nones: no audio for any video;
    - a list/tuple: exactly one entry per video;
    - a 3-D array (B, C, N): B must equal the number of videos;
    - a 1-D or 2-D array: a single track, valid only for a single video.
    """
    if audio is None:
        return [None] * n_videos
    if isinstance(audio, (list, tuple)):
        if len(audio) != n_videos:
            raise OutputInvalid(f"{len(audio)} audio tracks for {n_videos} videos",
                                code="audio_pairing_mismatch")
        return [None if a is None else _track(a) for a in audio]
    arr = np.asarray(audio)
    if arr.ndim == 3:
        if arr.shape[0] != n_videos:
            raise OutputInvalid(f"audio batch of {arr.shape[0]} for {n_videos} videos",
                                code="audio_pairing_mismatch")
        return [_track(a) for a in arr]
    if n_videos != 1:
        raise OutputInvalid(f"a single audio track cannot be paired with {n_videos} videos",
                            code="audio_pairing_mismatch")
    return [_track(arr)]


def _track(audio) -> np.ndarray:
    arr = np.asarray(audio)
    if arr.ndim == 2 and min(arr.shape) > MAX_CHANNELS:
        raise OutputInvalid(f"audio with shape {arr.shape} has more than {MAX_CHANNELS} "
                            "channels", code="audio_channels_unsupported")
    track = to_channel_first(arr)
    if not np.isfinite(track).all():
        raise OutputInvalid("audio contains NaN or infinite samples", code="audio_not_finite")
    return track


@dataclass(frozen=True)
class ClipTiming:
    video_s: float
    audio_s: float | None


def check_rate(sample_rate) -> int:
    """An audio sample rate must be a positive finite whole number of Hz."""
    try:
        value = float(sample_rate)
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value) or value <= 0 or value != round(value):
        raise OutputInvalid(f"invalid audio sample rate {clip(sample_rate)}",
                            code="sample_rate_invalid")
    return int(value)


def check_sync(frames: int, fps: int, samples: int | None, sample_rate: int | None
               ) -> ClipTiming:
    """|video_s - audio_s| must be within one frame plus one sample."""
    fps = coerce_fps(fps)
    video_s = frames / fps
    if samples is None or sample_rate is None:
        return ClipTiming(video_s, None)
    sample_rate = check_rate(sample_rate)
    audio_s = samples / sample_rate
    if abs(video_s - audio_s) > 1 / fps + 1 / sample_rate:
        raise OutputInvalid(f"audio lasts {audio_s:.3f} s but video {video_s:.3f} s",
                            code="av_duration_mismatch")
    return ClipTiming(video_s, audio_s)
