"""The worker's audio tap: exactly the job's audio, once, whatever the chunk semantics
and whenever the listener arrives (over the embedded spool bus)."""

from __future__ import annotations

import numpy as np
import pytest

from media.audio import AudioAggregator
from storage.bus import SpoolBus
from tasks.live import AudioTap


def tone(n: int) -> np.ndarray:
    return (0.3 * np.sin(np.arange(n) / 7.0)).astype(np.float32)


def streamed(bus: SpoolBus, job_id: str) -> np.ndarray:
    chunks = bus.read_audio(job_id, "")
    assert all(c.sample_rate == 16000 and c.attempt == 1 for c in chunks)
    return np.concatenate([c.samples for c in chunks], axis=1) if chunks else np.zeros((1, 0))


def run(bus: SpoolBus, job_id: str, mode: str, pieces, listen_after: int = 0):
    agg, tap = AudioAggregator(mode), AudioTap(bus, job_id, 1)
    for i, piece in enumerate(pieces):
        if i == listen_after:
            bus.listen(job_id)
        tap.add(agg.add(piece, 16000), agg)
    return agg.result().samples


def test_cumulative_snapshots_send_only_new_samples(tmp_path):
    bus, full = SpoolBus(tmp_path), tone(32000)
    # growing, then an empty and a shorter late snapshot: neither repeats nor truncates
    pieces = [full[:0], full[:8000], full[:24000], full, full[:0], full[:4000]]
    stored = run(bus, "job_a", "cumulative", pieces)
    assert [c.samples.shape[1] for c in bus.read_audio("job_a", "")] == [8000, 16000, 8000]
    np.testing.assert_array_equal(streamed(bus, "job_a"), stored)


def test_a_late_listener_gets_the_backlog_first(tmp_path):
    bus = SpoolBus(tmp_path)
    stored = run(bus, "job_b", "incremental", [tone(1000), tone(2000), tone(500)],
                 listen_after=2)
    assert [c.samples.shape[1] for c in bus.read_audio("job_b", "")] == [3500]
    np.testing.assert_array_equal(streamed(bus, "job_b"), stored)
    cursor = bus.read_audio("job_b", "")[-1].cursor
    assert bus.read_audio("job_b", cursor) == []


def test_nobody_listening_sends_nothing(tmp_path):
    bus = SpoolBus(tmp_path)
    run(bus, "job_c", "incremental", [tone(1000)], listen_after=99)
    assert bus.read_audio("job_c", "") == [] and not (tmp_path / "job_c").exists()


class Flaky:
    """A spool bus whose audio writes fail at the given call numbers (1-based)."""

    def __init__(self, bus: SpoolBus, failing: set[int]) -> None:
        self.bus, self.failing, self.calls = bus, failing, 0

    def add_audio(self, *args):
        self.calls += 1
        if self.calls in self.failing:
            raise ConnectionError("bus write failed")
        return self.bus.add_audio(*args)

    def __getattr__(self, name):
        return getattr(self.bus, name)


@pytest.mark.parametrize("mode", ["incremental", "cumulative"])
def test_a_failed_write_is_made_up_by_the_next(tmp_path, mode):
    bus = SpoolBus(tmp_path)
    bus.listen("job_d")
    full = tone(40000)
    pieces = ([full[i:i + 10000] for i in range(0, 40000, 10000)] if mode == "incremental"
              else [full[:i] for i in range(10000, 40001, 10000)])
    agg, tap = AudioAggregator(mode), AudioTap(Flaky(bus, {2}), "job_d", 1)
    for piece in pieces:
        tap.add(agg.add(piece, 16000), agg)
    assert [c.samples.shape[1] for c in bus.read_audio("job_d", "")] == [10000, 20000, 10000]
    np.testing.assert_array_equal(streamed(bus, "job_d"), agg.result().samples)


def test_the_last_chunk_lost_is_sent_at_the_end(tmp_path):
    bus = SpoolBus(tmp_path)
    bus.listen("job_e")
    agg, tap = AudioAggregator("incremental"), AudioTap(Flaky(bus, {2}), "job_e", 1)
    for piece in (tone(1000), tone(500)):
        tap.add(agg.add(piece, 16000), agg)
    tap.finish(agg)
    np.testing.assert_array_equal(streamed(bus, "job_e"), agg.result().samples)


def test_a_bus_that_stays_down_is_given_up(tmp_path):
    bus = SpoolBus(tmp_path)
    bus.listen("job_f")
    flaky = Flaky(bus, set(range(1, 100)))
    agg, tap = AudioAggregator("incremental"), AudioTap(flaky, "job_f", 1)
    for _ in range(10):
        tap.add(agg.add(tone(100), 16000), agg)
    assert flaky.calls == AudioTap.MAX_FAILURES and tap.bus is None
