"""Incremental audio encoding for streamed speech responses (``stream_format: "audio"``).

A stream is encoded with the same container, codec and rate as the stored output
(``encode.FORMATS``), so a client hears what the job keeps. What differs is the sink: the
muxer writes into a collector that cannot seek, as a socket cannot, so FFmpeg writes what a
live stream needs instead of patching the start afterwards. WAV then keeps its open-ended
sizes (0xFFFFFFFF); MP3 carries no Xing/LAME header, so decoders cannot trim the codec
delay (1105 samples at the start and up to a frame at the end more than the stored file);
FLAC's STREAMINFO says "total samples unknown"; and Ogg pages are cut every 100 ms instead
of every second so that Opus leaves as it is made. One resampler lives as long as the
stream, so chunk boundaries neither click nor lose samples; the codecs' own framing (1024
samples for PCM, a codec frame otherwise) holds back at most one frame until the next
chunk or ``close``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import av
import numpy as np

from core.errors import EncodingFailed, InvalidRequest, clip

from .audio import Audio
from .encode import (
    FORMATS,
    LAYOUTS,
    add_audio_stream,
    audio_frame,
    mux_frames,
    stream_resampler,
    target_rate,
)

STREAMABLE: frozenset[str] = frozenset(FORMATS)

# Ogg's default is a page a second; a page each 100 ms costs about 3 % at 64 kbit/s.
_CONTAINER_OPTIONS = {"ogg": {"page_duration": "100000"}}


class _Sink:
    """Collects what the muxer writes. No seek or tell: FFmpeg treats it as a pipe."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out = b"".join(self._parts)
        self._parts.clear()
        return out


class StreamEncoder:
    """Encodes one response as its audio arrives; each call returns the bytes ready now.

    The concatenation of everything ``add`` and ``close`` return is one decodable file.
    A stream that never got a sample is no file at all: ``close`` returns b"" for every
    format (FLAC's muxer would still write its header; that is dropped), so a caller can
    tell "no audio" by the empty result. Calls after ``close`` are refused.
    """

    def __init__(self, fmt_name: str, sample_rate: int, channels: int) -> None:
        if fmt_name not in STREAMABLE:
            raise InvalidRequest(f"response format {clip(fmt_name)!s} cannot be streamed",
                                 code="unsupported_stream_format", param="response_format")
        if channels not in LAYOUTS:
            raise ValueError(f"cannot stream {channels} channels")
        if int(sample_rate) != sample_rate or sample_rate <= 0:
            raise ValueError(f"invalid sample rate {sample_rate!r}")
        self.format = FORMATS[fmt_name]
        self.content_type = self.format.content_type
        self.input_rate = int(sample_rate)
        self.sample_rate = target_rate(self.format, self.input_rate)  # what is sent
        self.channels = channels
        self._sink = _Sink()
        self._closed = False
        self._any_audio = False
        # FFmpeg flushes its I/O buffer after every packet when the output cannot seek.
        options = _CONTAINER_OPTIONS.get(self.format.container, {})
        with _failures(self.format.name):
            self._container = av.open(self._sink, mode="w", format=self.format.container,
                                      container_options=options)
            self._stream = add_audio_stream(self._container, self.format.codec,
                                            self.sample_rate, channels,
                                            self.format.sample_format, self.format.bit_rate)
            self._resampler = stream_resampler(self._stream)

    def add(self, samples: np.ndarray) -> bytes:
        """Take (channels, k) float samples at the input rate (k may be 0)."""
        self._check_open()
        if samples.ndim != 2 or samples.shape[0] != self.channels:
            raise ValueError(f"expected ({self.channels}, k) samples, got {samples.shape}")
        if samples.shape[1]:
            self._any_audio = True
            frame = audio_frame(Audio(samples=samples, sample_rate=self.input_rate))
            with _failures(self.format.name):
                mux_frames(self._container, self._stream, self._resampler.resample(frame))
        return self._sink.take()

    def close(self) -> bytes:
        """Flush resampler, encoder and muxer; return the rest of the stream."""
        self._check_open()
        self._closed = True
        with _failures(self.format.name):
            mux_frames(self._container, self._stream, self._resampler.resample(None))
            self._container.mux(self._stream.encode(None))
            self._container.close()
        rest = self._sink.take()
        return rest if self._any_audio else b""

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("the stream encoder is closed")


@contextmanager
def _failures(fmt_name: str) -> Iterator[None]:
    """FFmpeg errors become EncodingFailed, as in ``encode.encode_audio``."""
    try:
        yield
    except av.FFmpegError as exc:
        raise EncodingFailed(f"{fmt_name} stream encoding failed "
                             f"({type(exc).__name__})") from exc


def stream_encoder(fmt: str, sample_rate: int, channels: int) -> StreamEncoder:
    """An encoder for ``fmt``; a format outside STREAMABLE is an InvalidRequest."""
    return StreamEncoder(fmt, sample_rate, channels)
