"""The worker's audio tap: exactly the job's audio, once, whatever the chunk semantics
and whenever the listener arrives (over the embedded spool bus)."""

from __future__ import annotations

import numpy as np

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
