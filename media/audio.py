"""Per-job audio aggregation.

Two chunk semantics exist in the wild and mixing them up loses or doubles audio:
- cumulative snapshots (an engine asked for CUMULATIVE output re-sends everything so
  far): keep the longest snapshot; empty or shorter late snapshots never truncate what
  we have;
- incremental frames (Piper, Qwen3-TTS, Audex's DELTA outputs): append, then
  concatenate once at the end.
Sample rate and channel count are fixed by the first non-empty chunk. Whatever the
semantics, ``add`` returns the samples that chunk adds to the job's audio, so a stream
sends exactly what ends up stored. An aggregator belongs to exactly one job; there is no
shared registry to leak between jobs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from core.errors import OutputInvalid

MAX_CHANNELS = 2
AudioMode = Literal["cumulative", "incremental"]


@dataclass(frozen=True)
class Audio:
    """Channel-first float32 samples, shape (channels, frames)."""

    samples: np.ndarray
    sample_rate: int

    @property
    def channels(self) -> int:
        return int(self.samples.shape[0])

    @property
    def frames(self) -> int:
        return int(self.samples.shape[1])

    @property
    def duration_s(self) -> float:
        return self.frames / self.sample_rate


def to_channel_first(samples: np.ndarray) -> np.ndarray:
    """Normalise 1-D or 2-D audio to float32 (C, N); reject what cannot be told apart."""
    arr = np.asarray(samples)
    if np.issubdtype(arr.dtype, np.unsignedinteger):  # offset binary (8-bit PCM)
        half = float(np.iinfo(arr.dtype).max + 1) / 2
        arr = (arr.astype(np.float32) - half) / half
    elif np.issubdtype(arr.dtype, np.integer):
        arr = arr.astype(np.float32) / float(np.iinfo(arr.dtype).max + 1)
    # Always a copy: a pipeline may reuse its output buffer for the next chunk.
    arr = np.array(arr, dtype=np.float32, copy=True)
    if arr.ndim == 1:
        return arr[np.newaxis, :]
    if arr.ndim != 2:
        raise OutputInvalid(f"audio must be 1-D or 2-D, got shape {arr.shape}",
                            code="audio_layout_invalid")
    rows, cols = arr.shape
    if rows <= MAX_CHANNELS < cols or (rows <= MAX_CHANNELS and cols == 0):
        return arr
    if cols <= MAX_CHANNELS < rows:
        return np.ascontiguousarray(arr.T)
    if rows > MAX_CHANNELS and cols > MAX_CHANNELS:
        raise OutputInvalid(f"audio with shape {arr.shape} has more than {MAX_CHANNELS} "
                            "channels", code="audio_channels_unsupported")
    raise OutputInvalid(f"audio layout {arr.shape} is ambiguous (channels-first or last?)",
                        code="audio_layout_ambiguous")


class AudioAggregator:
    def __init__(self, mode: AudioMode) -> None:
        self.mode = mode
        self.sample_rate: int | None = None
        self.channels: int | None = None
        self._parts: list[np.ndarray] = []
        self._longest: np.ndarray | None = None

    def add(self, samples: np.ndarray, sample_rate: int) -> np.ndarray:
        """Take one chunk; return the (C, k) samples it adds (k may be 0)."""
        if np.size(samples) == 0:
            return self._nothing()  # empty payloads happen (warm-up, trailing snapshots)
        if not sample_rate or not np.isfinite(sample_rate) or sample_rate <= 0:
            raise OutputInvalid(f"invalid sample rate {sample_rate!r}",
                                code="sample_rate_invalid")
        arr = to_channel_first(samples)
        if self.sample_rate is None:
            self.sample_rate, self.channels = int(sample_rate), arr.shape[0]
        elif int(sample_rate) != self.sample_rate:
            raise OutputInvalid(f"sample rate changed mid-job: {self.sample_rate} -> "
                                f"{int(sample_rate)}", code="audio_format_changed")
        elif arr.shape[0] != self.channels:
            raise OutputInvalid(f"channel count changed mid-job: {self.channels} -> "
                                f"{arr.shape[0]}", code="audio_format_changed")
        if self.mode == "incremental":
            self._parts.append(arr)
            return arr
        had = self.frames
        if arr.shape[1] <= had:
            return self._nothing()  # a shorter or equal late snapshot adds nothing
        self._longest = arr
        return arr[:, had:]

    def _nothing(self) -> np.ndarray:
        return np.zeros((self.channels or 1, 0), dtype=np.float32)

    @property
    def frames(self) -> int:
        if self.mode == "cumulative":
            return 0 if self._longest is None else int(self._longest.shape[1])
        return sum(int(p.shape[1]) for p in self._parts)

    def result(self) -> Audio:
        if self.sample_rate is None:
            raise OutputInvalid("no audio generated", code="no_audio")
        if self.mode == "incremental":
            samples = np.concatenate(self._parts, axis=1)
        else:
            samples = self._longest
        return Audio(samples=samples, sample_rate=self.sample_rate)
