"""Video assembly rules and the MP4 round trip, with real arrays and real PyAV."""

from __future__ import annotations

import io
import math

import av
import numpy as np
import pytest

from core.errors import EncodingFailed, OutputInvalid
from media.audio import Audio
from media.encode import add_audio_stream, encode_audio, encode_into
from media.mux import mux_mp4
from media.probe import VideoProbe, probe_video
from media.verify import PADDING_SAMPLES, SLACK_S, verify_encoded_video
from media.video import (
    ClipTiming,
    check_sync,
    coerce_fps,
    even_size,
    pair_audio,
    to_fhwc,
)

FPS = 24
FRAMES = 48
HEIGHT, WIDTH = 64, 96
SR = 32000
SILENCE_RMS = 1e-3
# Per channel (frequency, amplitude): distinct, so a dropped or swapped channel shows.
TONES = [(440.0, 0.5), (660.0, 0.25)]


def sine(sr: int, seconds: float, tones=TONES) -> np.ndarray:
    t = np.arange(int(round(sr * seconds)), dtype=np.float64) / sr
    return np.stack([a * np.sin(2 * np.pi * f * t) for f, a in tones]).astype(np.float32)


def ramp_clip(frames: int = FRAMES, height: int = HEIGHT, width: int = WIDTH) -> np.ndarray:
    """uint8 FHWC: red rises with the frame index, green with x, blue with y."""
    clip = np.zeros((frames, height, width, 3), dtype=np.uint8)
    clip[..., 0] = (np.arange(frames) * 5 % 256)[:, None, None]
    clip[..., 1] = (np.arange(width) * 2 % 256)[None, None, :]
    clip[..., 2] = (np.arange(height) * 3 % 256)[None, :, None]
    return clip


def raises_code(exc_type, code: str, fn, *args, **kwargs):
    with pytest.raises(exc_type) as info:
        fn(*args, **kwargs)
    assert info.value.code == code, info.value.message
    return info.value


@pytest.fixture(scope="module")
def stereo_audio() -> Audio:
    return Audio(samples=sine(SR, FRAMES / FPS), sample_rate=SR)


@pytest.fixture(scope="module")
def av_mp4(stereo_audio: Audio) -> bytes:
    return mux_mp4(ramp_clip(), FPS, stereo_audio)


@pytest.fixture(scope="module")
def silent_mp4() -> bytes:
    return mux_mp4(ramp_clip(), FPS, None)


# ---- coerce_fps ----------------------------------------------------------------------

@pytest.mark.parametrize(("given", "expected"),
                         [(23.976, 24), (29.97, 30), (24, 24), ("25", 25), (59.94, 60)])
def test_coerce_fps_rounds_to_an_integer_rate(given, expected) -> None:
    fps = coerce_fps(given)
    assert fps == expected
    assert type(fps) is int


@pytest.mark.parametrize("given", [0, 0.0, 0.4, -24, -0.6, math.nan, math.inf, -math.inf,
                                   "abc", "nan", None, [24]])
def test_coerce_fps_rejects_non_positive_or_non_finite(given) -> None:
    err = raises_code(OutputInvalid, "fps_invalid", coerce_fps, given)
    assert not err.retryable


# ---- to_fhwc -------------------------------------------------------------------------

def test_fhwc_fchw_and_cfhw_normalise_to_the_same_clip() -> None:
    rng = np.random.default_rng(7)
    clip = rng.integers(0, 256, size=(4, 6, 8, 3), dtype=np.uint8)
    fchw = clip.transpose(0, 3, 1, 2)
    cfhw = clip.transpose(3, 0, 1, 2)
    assert fchw.shape == (4, 3, 6, 8) and cfhw.shape == (3, 4, 6, 8)
    for layout in (clip, fchw, cfhw):
        out = to_fhwc(layout)
        assert out.dtype == np.uint8
        assert out.shape == (4, 6, 8, 3)
        assert out.flags["C_CONTIGUOUS"]
        np.testing.assert_array_equal(out, clip)


def test_float_frames_are_scaled_from_unit_range_and_clipped() -> None:
    frames = np.zeros((2, 4, 4, 3), dtype=np.float32)
    frames[0, 0, 0] = [0.0, 0.5, 1.0]
    frames[0, 0, 1] = [-0.5, 2.0, 1e6]
    frames[1] = 0.25
    out = to_fhwc(frames)
    assert out.dtype == np.uint8
    assert out[0, 0, 0, 0] == 0 and out[0, 0, 0, 2] == 255
    assert out[0, 0, 0, 1] in (127, 128)
    assert out[0, 0, 1].tolist() == [0, 255, 255]
    assert set(np.unique(out[1]).tolist()) <= {63, 64}


def test_float_channel_first_frames_are_scaled_too() -> None:
    fchw = np.full((2, 3, 4, 4), 1.0, dtype=np.float64)
    fchw[:, 0] = 0.0
    out = to_fhwc(fchw)
    assert out.shape == (2, 4, 4, 3)
    assert (out[..., 0] == 0).all() and (out[..., 1:] == 255).all()


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_float_frames_are_rejected(bad) -> None:
    frames = np.full((2, 4, 4, 3), 0.5, dtype=np.float32)
    frames[1, 2, 3, 0] = bad
    raises_code(OutputInvalid, "video_not_finite", to_fhwc, frames)


@pytest.mark.parametrize("shape", [(3, 3, 8, 3), (5, 3, 8, 3), (3, 5, 8, 3), (3, 3, 8, 8)])
def test_ambiguous_layouts_are_rejected_not_guessed(shape) -> None:
    raises_code(OutputInvalid, "video_layout_ambiguous", to_fhwc,
                np.zeros(shape, dtype=np.uint8))


@pytest.mark.parametrize("shape", [(4, 6, 8, 4), (4, 6, 8, 1), (4, 6, 8), (6, 8, 3),
                                   (1, 4, 6, 8, 3), (4, 6, 3, 8)])
def test_layouts_without_a_channel_axis_or_not_4d_are_invalid(shape) -> None:
    raises_code(OutputInvalid, "video_layout_invalid", to_fhwc,
                np.zeros(shape, dtype=np.uint8))


@pytest.mark.parametrize(("shape", "dtype"), [((0, 6, 8, 3), np.uint8),
                                              ((0, 3, 6, 8), np.uint8),
                                              ((3, 0, 6, 8), np.uint8),
                                              ((0, 6, 8, 3), np.float32)])
def test_zero_frames_are_rejected(shape, dtype) -> None:
    raises_code(OutputInvalid, "no_frames", to_fhwc, np.zeros(shape, dtype=dtype))


# ---- even_size -----------------------------------------------------------------------

@pytest.mark.parametrize(("h", "w"), [(5, 8), (6, 7), (5, 7)])
def test_odd_sizes_are_padded_by_replicating_the_edge(h, w) -> None:
    clip = ramp_clip(frames=3, height=h, width=w)
    out = even_size(clip)
    eh, ew = h + h % 2, w + w % 2
    assert out.shape == (3, eh, ew, 3)
    assert out.dtype == np.uint8
    np.testing.assert_array_equal(out[:, :h, :w], clip)
    if h % 2:
        np.testing.assert_array_equal(out[:, h, :w], clip[:, h - 1])
    if w % 2:
        np.testing.assert_array_equal(out[:, :h, w], clip[:, :, w - 1])
    if h % 2 and w % 2:
        np.testing.assert_array_equal(out[:, h, w], clip[:, h - 1, w - 1])


def test_even_sizes_are_returned_unchanged() -> None:
    clip = ramp_clip(frames=2, height=6, width=8)
    assert even_size(clip) is clip


# ---- pair_audio ----------------------------------------------------------------------

def test_no_audio_pairs_none_with_every_video() -> None:
    assert pair_audio(None, 3) == [None, None, None]
    assert pair_audio([None, None], 2) == [None, None]


def test_a_list_gives_one_channel_first_track_per_video() -> None:
    n = 200
    mono = np.linspace(-0.5, 0.5, n, dtype=np.float32)
    stereo_first = sine(8000, n / 8000)
    stereo_last = sine(8000, n / 8000, tones=[(300.0, 0.3), (500.0, 0.1)]).T
    tracks = pair_audio([mono, stereo_first, stereo_last], 3)
    assert [t.shape for t in tracks] == [(1, n), (2, n), (2, n)]
    assert all(t.dtype == np.float32 for t in tracks)
    np.testing.assert_array_equal(tracks[0][0], mono)
    np.testing.assert_array_equal(tracks[1], stereo_first)
    np.testing.assert_array_equal(tracks[2], stereo_last.T)


@pytest.mark.parametrize(("count", "n_videos"), [(1, 2), (3, 2), (0, 1)])
def test_a_list_of_the_wrong_length_is_a_pairing_mismatch(count, n_videos) -> None:
    tracks = [np.zeros(100, dtype=np.float32) for _ in range(count)]
    raises_code(OutputInvalid, "audio_pairing_mismatch", pair_audio, tracks, n_videos)


def test_a_batch_is_paired_in_order() -> None:
    batch = np.stack([np.full((2, 100), 0.1 * (i + 1), dtype=np.float32) for i in range(3)])
    batch[:, 1] *= -1  # the channels differ too, so a channel swap would show
    tracks = pair_audio(batch, 3)
    assert len(tracks) == 3
    for i, track in enumerate(tracks):
        assert track.shape == (2, 100)
        np.testing.assert_array_equal(track, batch[i])
        assert track[0, 0] == pytest.approx(0.1 * (i + 1))


def test_a_batch_copies_rather_than_aliases_the_engine_buffer() -> None:
    batch = np.full((2, 1, 50), 0.2, dtype=np.float32)
    tracks = pair_audio(batch, 2)
    batch[:] = 0.9
    assert np.all(tracks[0] == np.float32(0.2)) and np.all(tracks[1] == np.float32(0.2))


@pytest.mark.parametrize("n_videos", [1, 2, 4])
def test_a_batch_of_another_size_is_a_pairing_mismatch(n_videos) -> None:
    batch = np.zeros((3, 2, 100), dtype=np.float32)
    raises_code(OutputInvalid, "audio_pairing_mismatch", pair_audio, batch, n_videos)


@pytest.mark.parametrize("shape", [(100,), (2, 100), (100, 2), (1, 100)])
def test_a_single_track_cannot_pair_with_several_videos(shape) -> None:
    raises_code(OutputInvalid, "audio_pairing_mismatch", pair_audio,
                np.zeros(shape, dtype=np.float32), 2)


def test_a_single_track_pairs_with_a_single_video() -> None:
    n = 300
    stereo = sine(8000, n / 8000)
    [mono] = pair_audio(stereo[0], 1)
    [first] = pair_audio(stereo, 1)
    [last] = pair_audio(stereo.T.copy(), 1)
    assert mono.shape == (1, n)
    np.testing.assert_array_equal(mono[0], stereo[0])
    for track in (first, last):
        assert track.shape == (2, n)
        np.testing.assert_array_equal(track, stereo)


def test_int16_tracks_are_scaled_to_float() -> None:
    [track] = pair_audio(np.full(100, 16384, dtype=np.int16), 1)
    assert track.dtype == np.float32
    assert track[0, 0] == pytest.approx(0.5)


@pytest.mark.parametrize("audio", [np.zeros((3, 100), np.float32),
                                   np.zeros((100, 6), np.float32),
                                   [np.zeros((3, 100), np.float32)]])
def test_more_than_two_channels_is_unsupported(audio) -> None:
    raises_code(OutputInvalid, "audio_channels_unsupported", pair_audio, audio, 1)


def test_a_batch_with_too_many_channels_is_unsupported() -> None:
    raises_code(OutputInvalid, "audio_channels_unsupported", pair_audio,
                np.zeros((2, 3, 100), np.float32), 2)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
@pytest.mark.parametrize("wrap", ["single", "list", "batch"])
def test_non_finite_audio_is_rejected(bad, wrap) -> None:
    track = np.full((2, 100), 0.1, dtype=np.float32)
    track[1, 50] = bad
    good = np.full((2, 100), 0.1, dtype=np.float32)
    audio, n = {"single": (track, 1), "list": ([good, track], 2),
                "batch": (np.stack([good, track]), 2)}[wrap]
    raises_code(OutputInvalid, "audio_not_finite", pair_audio, audio, n)


# ---- check_sync ----------------------------------------------------------------------

def test_matching_durations_pass() -> None:
    timing = check_sync(FRAMES, FPS, 2 * SR, SR)
    assert timing == ClipTiming(video_s=2.0, audio_s=2.0)


# Tolerance is 1/24 + 1/32000 s = 1334.33 samples at 32 kHz: 1334 is inside, 1335 outside.
INSIDE, OUTSIDE = 1334, 1335


def test_the_sync_boundary_is_one_frame_plus_one_sample() -> None:
    tolerance = 1 / FPS + 1 / SR
    assert INSIDE / SR < tolerance < OUTSIDE / SR
    for sign in (1, -1):
        timing = check_sync(FRAMES, FPS, 2 * SR + sign * INSIDE, SR)
        assert timing.audio_s == pytest.approx(2.0 + sign * INSIDE / SR)
        raises_code(OutputInvalid, "av_duration_mismatch", check_sync,
                    FRAMES, FPS, 2 * SR + sign * OUTSIDE, SR)


def test_a_doubled_audio_duration_is_a_mismatch() -> None:
    raises_code(OutputInvalid, "av_duration_mismatch", check_sync, FRAMES, FPS, 4 * SR, SR)


def test_no_audio_reports_no_audio_duration() -> None:
    assert check_sync(FRAMES, FPS, None, None) == ClipTiming(video_s=2.0, audio_s=None)
    assert check_sync(30, 30, None, SR).audio_s is None


@pytest.mark.parametrize("rate", [0, -16000])
def test_a_non_positive_sample_rate_is_invalid(rate) -> None:
    raises_code(OutputInvalid, "sample_rate_invalid", check_sync, FRAMES, FPS, 2 * SR, rate)


# ---- mux_mp4 / probe_video / verify_encoded_video ------------------------------------

def test_the_round_trip_keeps_streams_frames_rate_and_size(av_mp4: bytes) -> None:
    probe = probe_video(av_mp4)
    assert isinstance(probe, VideoProbe)
    assert probe.video_codec == "h264"
    assert probe.frames == FRAMES
    assert probe.fps == pytest.approx(FPS)
    assert (probe.width, probe.height) == (WIDTH, HEIGHT)
    assert probe.duration_s == pytest.approx(FRAMES / FPS)
    assert probe.audio is not None and probe.audio_codec in ("aac", "aac_fixed")
    assert probe.audio.sample_rate == SR
    assert probe.audio.channels == 2
    assert probe.audio.samples.shape == (2, probe.audio.frames)
    tolerance = PADDING_SAMPLES / SR + SLACK_S
    assert abs(probe.audio.duration_s - 2.0) <= tolerance


def test_the_muxed_audio_keeps_its_channels_apart(av_mp4: bytes) -> None:
    samples = probe_video(av_mp4).audio.samples
    left, right = (float(np.sqrt(np.mean(np.square(ch, dtype=np.float64)))) for ch in samples)
    # Sines of amplitude 0.5 and 0.25: RMS 0.354 and 0.177 (a little less with padding).
    assert left == pytest.approx(0.5 / math.sqrt(2), rel=0.1)
    assert right == pytest.approx(0.25 / math.sqrt(2), rel=0.1)


def test_the_muxed_frames_decode_to_the_generated_pictures(av_mp4: bytes) -> None:
    clip = ramp_clip()
    with av.open(io.BytesIO(av_mp4), mode="r") as container:
        decoded = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(decoded) == FRAMES
    for i in (0, 20, FRAMES - 1):
        assert decoded[i].shape == (HEIGHT, WIDTH, 3)
        diff = np.abs(decoded[i].astype(np.int16) - clip[i].astype(np.int16))
        assert float(diff.mean()) < 6.0, i


def test_the_mp4_is_faststart(av_mp4: bytes, silent_mp4: bytes) -> None:
    for data in (av_mp4, silent_mp4):
        assert data[4:8] == b"ftyp"
        moov, mdat = data.find(b"moov"), data.find(b"mdat")
        assert 0 < moov < mdat


def test_a_clip_muxed_without_audio_probes_without_audio(silent_mp4: bytes) -> None:
    probe = probe_video(silent_mp4)
    assert probe.audio is None
    assert probe.audio_codec is None
    assert probe.frames == FRAMES
    verify_encoded_video(probe, frames=FRAMES, fps=FPS, width=WIDTH, height=HEIGHT,
                         audio_s=None, sample_rate=None, channels=None,
                         silence_rms=SILENCE_RMS)


def test_verify_accepts_the_file_it_was_made_for(av_mp4: bytes) -> None:
    verify_encoded_video(probe_video(av_mp4), frames=FRAMES, fps=FPS, width=WIDTH,
                         height=HEIGHT, audio_s=2.0, sample_rate=SR, channels=2,
                         silence_rms=SILENCE_RMS)


def test_verify_fails_a_file_that_lost_its_audio(silent_mp4: bytes) -> None:
    raises_code(EncodingFailed, "audio_missing", verify_encoded_video, probe_video(silent_mp4),
                frames=FRAMES, fps=FPS, width=WIDTH, height=HEIGHT, audio_s=2.0,
                sample_rate=SR, channels=2, silence_rms=SILENCE_RMS)


@pytest.mark.parametrize(("change", "code"), [
    ({"frames": FRAMES - 1}, "frame_count_mismatch"),
    ({"frames": FRAMES + 1}, "frame_count_mismatch"),
    ({"width": WIDTH + 2}, "size_mismatch"),
    ({"height": HEIGHT - 2}, "size_mismatch"),
    ({"width": HEIGHT, "height": WIDTH}, "size_mismatch"),
    ({"fps": 25}, "fps_mismatch"),
    ({"fps": 30}, "fps_mismatch"),
    ({"channels": 1}, "encoding_failed"),
    ({"sample_rate": 44100}, "encoding_failed"),
])
def test_verify_fails_what_was_not_generated(av_mp4: bytes, change: dict, code: str) -> None:
    expected = {"frames": FRAMES, "fps": FPS, "width": WIDTH, "height": HEIGHT,
                "audio_s": 2.0, "sample_rate": SR, "channels": 2,
                "silence_rms": SILENCE_RMS, **change}
    raises_code(EncodingFailed, code, verify_encoded_video, probe_video(av_mp4), **expected)


def test_verify_fails_an_audio_duration_that_differs(av_mp4: bytes) -> None:
    raises_code(EncodingFailed, "duration_mismatch", verify_encoded_video,
                probe_video(av_mp4), frames=FRAMES, fps=FPS, width=WIDTH, height=HEIGHT,
                audio_s=3.0, sample_rate=SR, channels=2, silence_rms=SILENCE_RMS)


def test_verify_fails_a_silent_track() -> None:
    silent = Audio(samples=np.zeros((1, 2 * SR), dtype=np.float32), sample_rate=SR)
    probe = probe_video(mux_mp4(ramp_clip(), FPS, silent))
    assert probe.audio is not None
    raises_code(EncodingFailed, "silent_audio", verify_encoded_video, probe, frames=FRAMES,
                fps=FPS, width=WIDTH, height=HEIGHT, audio_s=2.0, sample_rate=SR,
                channels=1, silence_rms=SILENCE_RMS)


def test_mono_22050_muxes_and_probes_at_its_own_rate() -> None:
    rate = 22050
    mono = Audio(samples=sine(rate, 2.0, tones=[(440.0, 0.5)]), sample_rate=rate)
    probe = probe_video(mux_mp4(ramp_clip(), FPS, mono))
    assert probe.audio is not None
    assert probe.audio.sample_rate == rate
    assert probe.audio.channels == 1
    assert abs(probe.audio.duration_s - 2.0) <= PADDING_SAMPLES / rate + SLACK_S
    verify_encoded_video(probe, frames=FRAMES, fps=FPS, width=WIDTH, height=HEIGHT,
                         audio_s=2.0, sample_rate=rate, channels=1,
                         silence_rms=SILENCE_RMS)


def test_assembled_odd_channel_first_float_frames_mux_at_the_padded_size() -> None:
    clip = ramp_clip(frames=12, height=63, width=95).astype(np.float32) / 255.0
    frames = even_size(to_fhwc(clip.transpose(0, 3, 1, 2)))
    assert frames.shape == (12, 64, 96, 3)
    probe = probe_video(mux_mp4(frames, coerce_fps(29.97), None))
    assert (probe.width, probe.height, probe.frames) == (96, 64, 12)
    assert probe.fps == pytest.approx(30)


# ---- probe_video on what is not a video ----------------------------------------------

@pytest.mark.parametrize("data", [b"", b"not a video at all" * 64, bytes(range(256)) * 16])
def test_garbage_does_not_probe(data: bytes) -> None:
    with pytest.raises(EncodingFailed):
        probe_video(data)


@pytest.mark.parametrize("fmt", ["aac", "mp3"])
def test_audio_only_files_do_not_probe_as_video(stereo_audio: Audio, fmt: str) -> None:
    data = encode_audio(stereo_audio, fmt).data
    assert len(data) > 1000
    with pytest.raises(EncodingFailed):
        probe_video(data)


def test_an_audio_only_mp4_has_no_video_stream(stereo_audio: Audio) -> None:
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as container:
        stream = add_audio_stream(container, "aac", SR, 2, "fltp", 128_000)
        encode_into(container, stream, stereo_audio)
    raises_code(EncodingFailed, "video_missing", probe_video, buf.getvalue())


def test_a_truncated_mp4_does_not_probe(av_mp4: bytes) -> None:
    with pytest.raises(EncodingFailed):
        probe_video(av_mp4[:200])
