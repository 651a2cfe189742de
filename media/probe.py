"""Re-open produced bytes and report what is really in them.

Encoders and muxers fail quietly (a stream dropped, a rate changed), so every output
is decoded again before upload and compared with what we meant to produce.
"""

from __future__ import annotations

import io
import wave
from dataclasses import dataclass

import av
import numpy as np

from core.errors import EncodingFailed


@dataclass(frozen=True)
class AudioProbe:
    codec: str
    sample_rate: int
    channels: int
    frames: int
    samples: np.ndarray  # (C, N) float32, decoded

    @property
    def duration_s(self) -> float:
        return self.frames / self.sample_rate if self.sample_rate else 0.0


def _open(data: bytes, container_format: str | None, options: dict | None):
    return av.open(io.BytesIO(data), mode="r", format=container_format, options=options or {})


def probe_audio(data: bytes, *, container_format: str | None = None,
                raw_rate: int | None = None, raw_channels: int = 1) -> AudioProbe:
    """Decode every audio frame; raw PCM needs its rate and channels given."""
    if container_format == "wav" and (probe := _probe_wav(data)) is not None:
        return probe
    options = None
    if container_format == "s16le":
        options = {"sample_rate": str(raw_rate), "ch_layout": "mono" if raw_channels == 1
                   else "stereo"}
    try:
        with _open(data, container_format, options) as container:
            if not container.streams.audio:
                raise EncodingFailed("encoded file has no audio stream", code="audio_missing")
            stream = container.streams.audio[0]
            chunks = [frame.to_ndarray().reshape(frame.layout.nb_channels, -1)
                      if frame.format.is_planar
                      else frame.to_ndarray().reshape(-1, frame.layout.nb_channels).T
                      for frame in container.decode(stream)]
            codec = stream.codec_context.name
            rate = stream.codec_context.sample_rate
            channels = stream.codec_context.layout.nb_channels
    except av.FFmpegError as exc:
        raise EncodingFailed(f"encoded audio does not decode ({type(exc).__name__})") from exc
    samples = (np.concatenate(chunks, axis=1) if chunks
               else np.zeros((channels, 0), dtype=np.float32))
    if np.issubdtype(samples.dtype, np.integer):
        samples = samples.astype(np.float32) / float(np.iinfo(samples.dtype).max + 1)
    return AudioProbe(codec=codec, sample_rate=rate, channels=channels,
                      frames=int(samples.shape[1]), samples=samples.astype(np.float32))


def _probe_wav(data: bytes) -> AudioProbe | None:
    """A 16-bit PCM WAV file read by the standard library's parser instead of FFmpeg's:
    the same check (an independent reader of the bytes we wrote: header, length,
    samples), at a fraction of the cost of opening a container. None for anything else
    (another sample format, a header that disagrees with the data, a parse error):
    FFmpeg then has the last word."""
    try:
        with wave.open(io.BytesIO(data)) as w:
            channels, width, rate = w.getnchannels(), w.getsampwidth(), w.getframerate()
            raw = w.readframes(w.getnframes())
            declared = w.getnframes()
    except (wave.Error, EOFError):
        return None
    if width != 2 or channels < 1 or len(raw) != declared * channels * 2:
        return None
    pcm = np.frombuffer(raw, dtype="<i2").reshape(-1, channels).T
    return AudioProbe(codec="pcm_s16le", sample_rate=rate, channels=channels,
                      frames=declared, samples=pcm.astype(np.float32) / 32768.0)


@dataclass(frozen=True)
class VideoProbe:
    video_codec: str
    width: int
    height: int
    fps: float
    frames: int
    duration_s: float
    audio: AudioProbe | None
    pix_fmt: str | None = None
    faststart: bool = False

    @property
    def audio_codec(self) -> str | None:
        return self.audio.codec if self.audio else None


def probe_video(data: bytes) -> VideoProbe:
    """Count video packets and decode the audio track of an MP4."""
    try:
        with _open(data, "mp4", None) as container:
            if not container.streams.video:
                raise EncodingFailed("file has no video stream", code="video_missing")
            stream = container.streams.video[0]
            frames = sum(1 for p in container.demux(stream) if p.size)
            codec = stream.codec_context.name
            pix_fmt = stream.codec_context.pix_fmt
            width, height = stream.codec_context.width, stream.codec_context.height
            rate = stream.average_rate or stream.guessed_rate
            fps = float(rate) if rate else 0.0
            has_audio = bool(container.streams.audio)
    except av.FFmpegError as exc:
        raise EncodingFailed(f"video does not open ({type(exc).__name__})") from exc
    audio = probe_audio(data, container_format="mp4") if has_audio else None
    duration = frames / fps if fps else 0.0
    return VideoProbe(video_codec=codec, width=width, height=height, fps=fps, frames=frames,
                      duration_s=duration, audio=audio, pix_fmt=pix_fmt,
                      faststart=moov_first(data))


def moov_first(data: bytes) -> bool:
    """Faststart: the index (moov) comes before the media data (mdat or fragments)."""
    moov = data.find(b"moov")
    media = [i for i in (data.find(b"mdat"), data.find(b"moof")) if i >= 0]
    return moov >= 0 and (not media or moov < min(media))
