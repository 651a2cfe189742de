"""Audio encoding with PyAV into the OpenAI speech response formats.

Each format pins its container, codec and the sample rates the codec accepts; audio
is resampled only when the codec cannot take the native rate (Opus) or the format's
contract fixes one (``pcm`` is raw 24 kHz s16le, as OpenAI documents it).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import av
import numpy as np

from core.errors import EncodingFailed

from .audio import Audio


@dataclass(frozen=True)
class AudioFormat:
    name: str
    container: str
    codec: str
    demuxer: str  # FFmpeg's reader for the container (ADTS is written "adts", read "aac")
    decoders: tuple[str, ...]  # decoder names a correct file probes as
    content_type: str
    extension: str
    sample_format: str
    rates: tuple[int, ...] | None = None  # None: any rate
    fixed_rate: int | None = None
    bit_rate: int | None = None


FORMATS: dict[str, AudioFormat] = {f.name: f for f in (
    AudioFormat("mp3", "mp3", "libmp3lame", "mp3", ("mp3float", "mp3"), "audio/mpeg", "mp3",
                "s16p",
                (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000),
                bit_rate=128_000),
    AudioFormat("opus", "ogg", "libopus", "ogg", ("opus", "libopus"), "audio/ogg", "opus",
                "s16", fixed_rate=48000,
                bit_rate=64_000),
    AudioFormat("aac", "adts", "aac", "aac", ("aac", "aac_fixed"), "audio/aac", "aac", "fltp",
                (7350, 8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000, 64000,
                 88200, 96000), bit_rate=128_000),
    AudioFormat("flac", "flac", "flac", "flac", ("flac",), "audio/flac", "flac", "s16"),
    AudioFormat("wav", "wav", "pcm_s16le", "wav", ("pcm_s16le",), "audio/wav", "wav", "s16"),
    AudioFormat("pcm", "s16le", "pcm_s16le", "s16le", ("pcm_s16le",), "audio/pcm", "pcm",
                "s16", fixed_rate=24000),
)}

LAYOUTS = {1: "mono", 2: "stereo"}


def target_rate(fmt: AudioFormat, native: int) -> int:
    if fmt.fixed_rate is not None:
        return fmt.fixed_rate
    if fmt.rates is None or native in fmt.rates:
        return native
    return min((r for r in fmt.rates if r >= native), default=max(fmt.rates))


def audio_frame(audio: Audio) -> av.AudioFrame:
    samples = np.ascontiguousarray(np.clip(audio.samples, -1.0, 1.0), dtype=np.float32)
    frame = av.AudioFrame.from_ndarray(samples, format="fltp", layout=LAYOUTS[audio.channels])
    frame.sample_rate = audio.sample_rate
    return frame


def add_audio_stream(container, codec: str, rate: int, channels: int, sample_format: str,
                     bit_rate: int | None = None):
    stream = container.add_stream(codec, rate=rate)
    stream.layout = LAYOUTS[channels]
    stream.format = sample_format
    if bit_rate:
        stream.bit_rate = bit_rate
    return stream


def stream_resampler(stream) -> av.AudioResampler:
    """Converts to the stream's format and rate in frames of the codec's size; keep one
    per stream, so that a long input fed in pieces resamples as one."""
    return av.AudioResampler(format=stream.format.name, layout=stream.layout.name,
                             rate=stream.rate, frame_size=stream.codec_context.frame_size
                             or 1024)


def mux_frames(container, stream, frames) -> None:
    for frame in frames:
        frame.pts = None
        container.mux(stream.encode(frame))


def encode_into(container, stream, audio: Audio) -> None:
    """Resample to the stream's format and rate, encode, flush."""
    resampler = stream_resampler(stream)
    mux_frames(container, stream, (*resampler.resample(audio_frame(audio)),
                                   *resampler.resample(None)))
    container.mux(stream.encode(None))


@dataclass(frozen=True)
class EncodedAudio:
    data: bytes
    format: AudioFormat
    sample_rate: int
    channels: int


def encode_audio(audio: Audio, fmt_name: str) -> EncodedAudio:
    fmt = FORMATS[fmt_name]
    rate = target_rate(fmt, audio.sample_rate)
    buf = io.BytesIO()
    try:
        with av.open(buf, mode="w", format=fmt.container) as container:
            stream = add_audio_stream(container, fmt.codec, rate, audio.channels,
                                      fmt.sample_format, fmt.bit_rate)
            encode_into(container, stream, audio)
    except (av.FFmpegError, ValueError) as exc:
        raise EncodingFailed(f"{fmt.name} encoding failed ({type(exc).__name__})") from exc
    return EncodedAudio(data=buf.getvalue(), format=fmt, sample_rate=rate,
                        channels=audio.channels)
