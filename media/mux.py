"""MP4 muxing with PyAV: H.264 yuv420p video plus AAC audio, faststart."""

from __future__ import annotations

import io
import tempfile
from pathlib import Path

import av
import numpy as np

from core.errors import EncodingFailed

from .audio import Audio
from .encode import FORMATS, add_audio_stream, encode_into, target_rate

X264_OPTIONS = {"preset": "veryfast", "crf": "20"}


def mux_mp4(frames: np.ndarray, fps: int, audio: Audio | None) -> bytes:
    """Encode uint8 (F, H, W, 3) frames (even H and W) and optional audio into MP4.

    Written through a temporary file: faststart moves the index to the front in a
    second pass, which FFmpeg can only do on a real file.
    """
    with tempfile.TemporaryDirectory(prefix="omnijobs-mux-") as tmp:
        path = Path(tmp) / "out.mp4"
        _mux_to(path, frames, fps, audio)
        return path.read_bytes()


def _mux_to(path: Path, frames: np.ndarray, fps: int, audio: Audio | None) -> None:
    try:
        with av.open(str(path), mode="w", format="mp4",
                     options={"movflags": "+faststart"}) as container:
            video = container.add_stream("libx264", rate=fps, options=X264_OPTIONS)
            video.width, video.height = int(frames.shape[2]), int(frames.shape[1])
            video.pix_fmt = "yuv420p"
            astream = None
            if audio is not None:
                aac = FORMATS["aac"]
                astream = add_audio_stream(container, aac.codec,
                                           target_rate(aac, audio.sample_rate),
                                           audio.channels, aac.sample_format, aac.bit_rate)
            for i, rgb in enumerate(frames):
                frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
                frame.pts = i
                container.mux(video.encode(frame))
            container.mux(video.encode(None))
            if astream is not None:
                encode_into(container, astream, audio)
    except (av.FFmpegError, ValueError) as exc:
        raise EncodingFailed(f"mp4 muxing failed ({type(exc).__name__})") from exc


def remux_faststart(data: bytes, keep_audio: bool = True) -> bytes:
    """The same MP4 with its index moved to the front, by stream copy (no re-encode);
    without its audio track when ``keep_audio`` is false.

    Engines that write MP4s to memory (vLLM-Omni's ``mux_av_video_audio_bytes``) leave
    the index after the media data, so a player must fetch the whole file first; and an
    engine that always renders sound (MiniMax-H3) muxes it in even when none was asked for.
    """
    with tempfile.TemporaryDirectory(prefix="omnijobs-remux-") as tmp:
        path = Path(tmp) / "out.mp4"
        try:
            with av.open(io.BytesIO(data), mode="r", format="mp4") as src, \
                    av.open(str(path), mode="w", format="mp4",
                            options={"movflags": "+faststart"}) as dst:
                kept = [s for s in src.streams
                        if s.type == "video" or (keep_audio and s.type == "audio")]
                copies = {s.index: dst.add_stream_from_template(s) for s in kept}
                for packet in src.demux(kept):
                    if packet.dts is None:  # the demuxer's end-of-stream marker
                        continue
                    packet.stream = copies[packet.stream.index]
                    dst.mux(packet)
        except (av.FFmpegError, ValueError) as exc:
            raise EncodingFailed(f"mp4 remux failed ({type(exc).__name__})") from exc
        return path.read_bytes()
