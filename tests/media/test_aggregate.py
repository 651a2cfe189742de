"""AudioAggregator: cumulative snapshots vs incremental frames, format pinning, layouts."""

from __future__ import annotations

import numpy as np
import pytest

from core.errors import OutputInvalid
from media.audio import Audio, AudioAggregator, to_channel_first

SR = 16000
MODES = ["cumulative", "incremental"]


def sine(frames: int, *, freq: float = 440.0, amp: float = 0.5, sr: int = SR,
         phase: float = 0.0) -> np.ndarray:
    t = np.arange(frames, dtype=np.float64) / sr
    return (amp * np.sin(2 * np.pi * freq * t + phase)).astype(np.float32)


def empty() -> np.ndarray:
    return np.zeros(0, dtype=np.float32)


# ---- cumulative snapshots ----------------------------------------------------------

def test_cumulative_keeps_the_longest_snapshot() -> None:
    full = sine(3000)
    agg = AudioAggregator("cumulative")
    for n in (1000, 2000, 3000):
        agg.add(full[:n].copy(), SR)
    out = agg.result()
    assert out.samples.shape == (1, 3000)
    np.testing.assert_array_equal(out.samples[0], full)
    assert agg.frames == 3000
    assert out.sample_rate == SR


def test_cumulative_does_not_concatenate_snapshots() -> None:
    agg = AudioAggregator("cumulative")
    agg.add(sine(100), SR)
    agg.add(sine(200), SR)
    assert agg.result().frames == 200  # not 300: snapshots re-decode everything so far


def test_cumulative_ignores_empty_snapshots() -> None:
    full = sine(1500)
    agg = AudioAggregator("cumulative")
    agg.add(empty(), SR)
    agg.add(full[:500].copy(), SR)
    agg.add(empty(), SR)
    agg.add(full.copy(), SR)
    agg.add(empty(), SR)  # a trailing empty payload must not wipe the result
    out = agg.result()
    assert out.frames == 1500
    np.testing.assert_array_equal(out.samples[0], full)


def test_cumulative_shorter_late_snapshot_never_truncates() -> None:
    full = sine(4000)
    agg = AudioAggregator("cumulative")
    agg.add(full.copy(), SR)
    agg.add(sine(700, freq=1000.0), SR)  # shorter and different: must be ignored
    out = agg.result()
    assert out.frames == 4000
    np.testing.assert_array_equal(out.samples[0], full)
    assert agg.frames == 4000


def test_cumulative_stereo_snapshots() -> None:
    left, right = sine(800), sine(800, freq=660.0, amp=0.25)
    agg = AudioAggregator("cumulative")
    agg.add(np.stack([left[:400], right[:400]]), SR)
    agg.add(np.stack([left, right]), SR)
    out = agg.result()
    assert out.channels == 2
    np.testing.assert_array_equal(out.samples, np.stack([left, right]))


# ---- incremental frames ------------------------------------------------------------

def test_incremental_concatenates_chunks_in_order() -> None:
    chunks = [sine(n, freq=f) for n, f in ((300, 220.0), (1, 330.0), (1234, 440.0),
                                           (77, 550.0))]
    agg = AudioAggregator("incremental")
    for c in chunks:
        agg.add(c.copy(), SR)
    out = agg.result()
    expected = np.concatenate(chunks)
    assert out.samples.shape == (1, expected.size)
    assert out.samples.dtype == np.float32
    np.testing.assert_array_equal(out.samples[0], expected)
    assert agg.frames == expected.size
    assert out.duration_s == pytest.approx(expected.size / SR)


def test_incremental_ignores_empty_chunks() -> None:
    a, b = sine(500), sine(600, freq=880.0)
    agg = AudioAggregator("incremental")
    agg.add(empty(), SR)
    agg.add(a.copy(), SR)
    agg.add(empty(), SR)
    agg.add(np.zeros((1, 0), dtype=np.float32), SR)
    agg.add(b.copy(), SR)
    out = agg.result()
    np.testing.assert_array_equal(out.samples[0], np.concatenate([a, b]))


def test_incremental_stereo_channel_last_chunks() -> None:
    c1 = np.stack([sine(100), sine(100, amp=0.1)], axis=1)  # (N, 2)
    c2 = np.stack([sine(50, freq=300.0), sine(50, freq=300.0, amp=0.1)], axis=1)
    agg = AudioAggregator("incremental")
    agg.add(c1, SR)
    agg.add(c2, SR)
    out = agg.result()
    assert out.samples.shape == (2, 150)
    np.testing.assert_array_equal(out.samples, np.concatenate([c1, c2], axis=0).T)


# ---- both modes: format pinning, empties, conversions --------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_sample_rate_change_mid_job_is_rejected(mode: str) -> None:
    agg = AudioAggregator(mode)
    agg.add(sine(100), SR)
    with pytest.raises(OutputInvalid) as info:
        agg.add(sine(200), 22050)
    assert info.value.code == "audio_format_changed"


@pytest.mark.parametrize("mode", MODES)
def test_channel_count_change_mid_job_is_rejected(mode: str) -> None:
    agg = AudioAggregator(mode)
    agg.add(sine(100), SR)
    with pytest.raises(OutputInvalid) as info:
        agg.add(np.stack([sine(200), sine(200)]), SR)
    assert info.value.code == "audio_format_changed"


@pytest.mark.parametrize("mode", MODES)
def test_format_is_fixed_by_first_non_empty_chunk(mode: str) -> None:
    agg = AudioAggregator(mode)
    agg.add(empty(), 8000)  # an empty warm-up payload does not pin the rate
    agg.add(sine(100), SR)
    assert agg.sample_rate == SR
    assert agg.channels == 1
    assert agg.result().sample_rate == SR


@pytest.mark.parametrize("mode", MODES)
def test_all_empty_input_has_no_audio(mode: str) -> None:
    agg = AudioAggregator(mode)
    agg.add(empty(), SR)
    agg.add(np.zeros((2, 0), dtype=np.float32), SR)
    assert agg.frames == 0
    with pytest.raises(OutputInvalid) as info:
        agg.result()
    assert info.value.code == "no_audio"


@pytest.mark.parametrize("mode", MODES)
def test_nothing_added_has_no_audio(mode: str) -> None:
    with pytest.raises(OutputInvalid) as info:
        AudioAggregator(mode).result()
    assert info.value.code == "no_audio"


@pytest.mark.parametrize("mode", MODES)
def test_int16_input_is_converted_to_float(mode: str) -> None:
    raw = np.array([-32768, -16384, 0, 16384, 32767], dtype=np.int16)
    agg = AudioAggregator(mode)
    agg.add(raw, SR)
    out = agg.result().samples
    assert out.dtype == np.float32
    assert out.shape == (1, 5)
    assert np.all(out >= -1.0) and np.all(out <= 1.0)
    np.testing.assert_allclose(out[0], [-1.0, -0.5, 0.0, 0.5, 32767 / 32768], atol=1e-7)


@pytest.mark.parametrize("mode", MODES)
def test_channel_last_input_is_transposed(mode: str) -> None:
    left, right = sine(64), sine(64, freq=1000.0, amp=0.2)
    agg = AudioAggregator(mode)
    agg.add(np.stack([left, right], axis=1), SR)  # (N, 2)
    out = agg.result()
    assert out.samples.shape == (2, 64)
    np.testing.assert_array_equal(out.samples[0], left)
    np.testing.assert_array_equal(out.samples[1], right)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", [(2, 2), (1, 1), (2, 1), (1, 2)])
def test_ambiguous_layout_is_rejected(mode: str, shape: tuple[int, int]) -> None:
    with pytest.raises(OutputInvalid) as info:
        AudioAggregator(mode).add(np.full(shape, 0.1, dtype=np.float32), SR)
    assert info.value.code == "audio_layout_ambiguous"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", [(3, 100), (100, 3), (6, 4800), (3, 3)])
def test_more_than_two_channels_is_rejected(mode: str, shape: tuple[int, int]) -> None:
    with pytest.raises(OutputInvalid) as info:
        AudioAggregator(mode).add(np.full(shape, 0.1, dtype=np.float32), SR)
    assert info.value.code == "audio_channels_unsupported"


@pytest.mark.parametrize("mode", MODES)
def test_three_dimensional_input_is_rejected(mode: str) -> None:
    with pytest.raises(OutputInvalid) as info:
        AudioAggregator(mode).add(np.zeros((1, 2, 100), dtype=np.float32), SR)
    assert info.value.code == "audio_layout_invalid"


@pytest.mark.parametrize("mode", MODES)
def test_aggregators_do_not_share_state(mode: str) -> None:
    a, b = AudioAggregator(mode), AudioAggregator(mode)
    sa = sine(300)
    sb = np.stack([sine(500, freq=880.0), sine(500, freq=880.0, amp=0.1)])
    a.add(sa.copy(), SR)
    b.add(sb.copy(), 22050)  # a different rate and channel count: no cross-job conflict
    assert a.sample_rate == SR and a.channels == 1
    assert b.sample_rate == 22050 and b.channels == 2
    ra, rb = a.result(), b.result()
    np.testing.assert_array_equal(ra.samples[0], sa)
    np.testing.assert_array_equal(rb.samples, sb)
    assert AudioAggregator(mode).frames == 0  # a fresh one starts empty


# ---- helpers -----------------------------------------------------------------------

def test_to_channel_first_keeps_channel_first_and_float32() -> None:
    x = np.stack([sine(10).astype(np.float64), sine(10, amp=0.1).astype(np.float64)])
    out = to_channel_first(x)
    assert out.shape == (2, 10)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, x, atol=1e-7)


def test_to_channel_first_int32_full_scale() -> None:
    out = to_channel_first(np.array([-(2 ** 31), 0, 2 ** 30], dtype=np.int32))
    np.testing.assert_allclose(out[0], [-1.0, 0.0, 0.5], atol=1e-7)


def test_audio_properties() -> None:
    audio = Audio(samples=np.zeros((2, 48000), dtype=np.float32), sample_rate=24000)
    assert audio.channels == 2
    assert audio.frames == 48000
    assert audio.duration_s == pytest.approx(2.0)


# ---- what each chunk adds (what a stream sends on) ----------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_add_returns_exactly_the_new_samples(mode: str) -> None:
    """Whatever the engine's chunk semantics, the new samples of every ``add`` joined
    together are the final audio: a streamed response and the stored file agree."""
    full = sine(5000)
    cuts = [0, 1000, 1000, 2500, 5000]
    agg = AudioAggregator(mode)
    chunks = ([full[:n].copy() for n in cuts] + [full[:1200].copy(), empty()]
              if mode == "cumulative" else
              [full[a:b].copy() for a, b in zip(cuts, cuts[1:], strict=False)] + [empty()])
    new = [agg.add(chunk, SR) for chunk in chunks]
    assert all(n.ndim == 2 for n in new)
    joined = np.concatenate(new, axis=1)
    np.testing.assert_array_equal(joined, agg.result().samples)
    np.testing.assert_array_equal(joined[0], full)
    assert [n.shape[1] for n in new if n.shape[1]] == [1000, 1500, 2500]
