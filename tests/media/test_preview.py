"""Video previews: the thumbnail is the clip's middle frame, the spritesheet a grid of
frames spread over the clip in order, both WebP decoded again and held to their frames."""

from __future__ import annotations

import numpy as np
import pytest

from core.errors import EncodingFailed
from media import preview
from media.mux import mux_mp4

FRAMES, HEIGHT, WIDTH = 40, 96, 160


def clip() -> np.ndarray:
    """Frame i is one flat grey level, rising with i: a frame is known by its colour."""
    frames = np.zeros((FRAMES, HEIGHT, WIDTH, 3), dtype=np.uint8)
    for i in range(FRAMES):
        frames[i] = 20 + i * 5
    return frames


@pytest.fixture(scope="module")
def mp4() -> bytes:
    return mux_mp4(clip(), 24, None)


def level(image: np.ndarray) -> float:
    return float(image.mean())


def test_the_thumbnail_is_the_middle_frame_at_the_video_size(mp4):
    thumb = preview.thumbnail(mp4)
    assert thumb.data[:4] == b"RIFF" and thumb.data[8:12] == b"WEBP"
    image = preview.decode_image(thumb.data)
    assert image.shape == (HEIGHT, WIDTH, 3) == (thumb.height, thumb.width, 3)
    assert abs(level(image) - (20 + FRAMES // 2 * 5)) < 3


def test_the_spritesheet_is_a_grid_of_frames_in_order(mp4):
    sheet = preview.spritesheet(mp4)
    image = preview.decode_image(sheet.data)
    assert (sheet.width, sheet.height) == (4 * WIDTH, 4 * HEIGHT)  # 16 tiles, full size
    tiles = [level(image[r * HEIGHT:(r + 1) * HEIGHT, c * WIDTH:(c + 1) * WIDTH])
             for r in range(4) for c in range(4)]
    assert tiles == sorted(tiles) and tiles[0] < 25 and tiles[-1] > 20 + (FRAMES - 1) * 5 - 5
    assert len({round(t) for t in tiles}) == 16  # sixteen different frames


def test_tiles_are_scaled_to_the_tile_width():
    wide = np.full((8, 64, 512, 3), 128, dtype=np.uint8)
    sheet = preview.spritesheet(mux_mp4(wide, 8, None))
    # 8 frames: a 3 x 3 grid of 256 x 32 tiles (the aspect ratio kept)
    assert (sheet.width, sheet.height) == (3 * preview.TILE_WIDTH, 3 * 32)


def test_a_preview_that_decodes_wrong_is_refused(mp4, monkeypatch):
    frame = preview.sample_frames(mp4, 1)[0]
    other = preview.encode_webp(255 - frame)
    monkeypatch.setattr(preview, "encode_webp", lambda _rgb: other)
    with pytest.raises(EncodingFailed) as exc:
        preview.thumbnail(mp4)
    assert exc.value.code == "preview_mismatch"


def test_bytes_that_are_no_video_fail_as_encoding():
    with pytest.raises(EncodingFailed):
        preview.thumbnail(b"not an mp4")
