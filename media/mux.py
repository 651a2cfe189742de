"""MP4 muxing with PyAV: H.264 yuv420p video plus AAC audio, faststart."""

from __future__ import annotations

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
