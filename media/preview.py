"""A video's previews: a still (``thumbnail``) and a grid of frames (``spritesheet``).

Both are made from the encoded MP4 itself, so they show what was stored whichever way
the video was made (muxed here or pre-encoded by the engine), and both are WebP, the
image type OpenAI's API serves them as. Each is decoded again and compared with the
frames it was made from before it is stored, as every other output is.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import av
import numpy as np

from core.errors import EncodingFailed

SHEET_FRAMES = 16  # at most: a 4 x 4 grid of frames spread over the clip
TILE_WIDTH = 256  # at most, in pixels; the tile keeps the video's aspect ratio
# Mean absolute difference (0-255) a decoded preview may have from its frames: lossy
# WebP at its default quality stays far below; a wrong or blank image does not.
MAX_MEAN_ERROR = 16.0


@dataclass(frozen=True)
class Preview:
    data: bytes
    width: int
    height: int


def sample_frames(mp4: bytes, count: int) -> list[np.ndarray]:
    """Up to ``count`` RGB frames spread evenly over the clip (the middle one for 1).
    Frames are counted first, so only the picked ones are kept in memory."""
    try:
        with av.open(io.BytesIO(mp4), mode="r", format="mp4") as container:
            if not container.streams.video:
                raise EncodingFailed("video has no video stream", code="video_missing")
            total = sum(1 for p in container.demux(container.streams.video[0]) if p.size)
        n = min(count, total)
        picks = {total // 2} if n == 1 else {round(i * (total - 1) / max(n - 1, 1))
                                             for i in range(n)}
        with av.open(io.BytesIO(mp4), mode="r", format="mp4") as container:
            frames = [f.to_ndarray(format="rgb24") for i, f in enumerate(
                container.decode(container.streams.video[0])) if i in picks]
    except av.FFmpegError as exc:
        raise EncodingFailed(f"video does not decode ({type(exc).__name__})") from exc
    if not frames:
        raise EncodingFailed("video has no frames to preview", code="no_frames")
    return frames


def _even(value: float) -> int:
    return max(2, int(value) // 2 * 2)


def _resize(rgb: np.ndarray, width: int, height: int) -> np.ndarray:
    frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
    return frame.reformat(width=width, height=height, format="rgb24").to_ndarray()


def grid(frames: list[np.ndarray]) -> np.ndarray:
    """The frames as tiles, left to right and top to bottom, on a black canvas."""
    height, width = frames[0].shape[:2]
    tile_w = _even(min(width, TILE_WIDTH))
    tile_h = _even(height * tile_w / width)
    columns = math.ceil(math.sqrt(len(frames)))
    rows = math.ceil(len(frames) / columns)
    sheet = np.zeros((rows * tile_h, columns * tile_w, 3), dtype=np.uint8)
    for i, frame in enumerate(frames):
        r, c = divmod(i, columns)
        sheet[r * tile_h:(r + 1) * tile_h, c * tile_w:(c + 1) * tile_w] = _resize(
            frame, tile_w, tile_h)
    return sheet


def encode_webp(rgb: np.ndarray) -> bytes:
    """One RGB image (even width and height) as a WebP file."""
    out = io.BytesIO()
    try:
        with av.open(out, mode="w", format="webp") as container:
            stream = container.add_stream("libwebp", rate=1)
            stream.height, stream.width = rgb.shape[:2]
            stream.pix_fmt = "yuv420p"
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
            for packet in (*stream.encode(frame), *stream.encode(None)):
                container.mux(packet)
    except av.FFmpegError as exc:
        raise EncodingFailed(f"preview does not encode ({type(exc).__name__})") from exc
    return out.getvalue()


def decode_image(data: bytes) -> np.ndarray:
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            frame = next(container.decode(video=0), None)
    except av.FFmpegError as exc:
        raise EncodingFailed(f"preview does not decode ({type(exc).__name__})") from exc
    if frame is None:
        raise EncodingFailed("preview has no image", code="preview_mismatch")
    return frame.to_ndarray(format="rgb24")


def verified(rgb: np.ndarray) -> Preview:
    """``rgb`` encoded, decoded again and held to what was meant."""
    data = encode_webp(rgb)
    back = decode_image(data)
    if back.shape != rgb.shape:
        raise EncodingFailed(f"preview decodes as {back.shape[1]}x{back.shape[0]}, made "
                             f"{rgb.shape[1]}x{rgb.shape[0]}", code="preview_mismatch")
    error = float(np.mean(np.abs(back.astype(np.int16) - rgb.astype(np.int16))))
    if error > MAX_MEAN_ERROR:
        raise EncodingFailed(f"preview differs from its frames (mean error {error:.1f})",
                             code="preview_mismatch")
    return Preview(data=data, width=rgb.shape[1], height=rgb.shape[0])


def thumbnail(mp4: bytes) -> Preview:
    """The clip's middle frame, at the video's size."""
    return verified(sample_frames(mp4, 1)[0])


def spritesheet(mp4: bytes) -> Preview:
    return verified(grid(sample_frames(mp4, SHEET_FRAMES)))
