"""bench.fleet_scrape stays runnable: a tiny run gives every figure, and the statement
count of a read does not grow with the queue. Nothing here is timed."""

from __future__ import annotations

from bench.fleet_scrape import run


def test_the_fleet_scrape_benchmark_runs():
    result = run(queued=300, finished=100, scrapes=2)
    for side in ("empty", "loaded"):
        assert 0 < result[side]["p50_ms"] <= result[side]["p95_ms"]
        assert result["read"][side]["p50_ms"] > 0
    assert result["statements"]["empty"] == result["statements"]["loaded"] == 5
    assert result["ratio_p50"] > 0 and result["read"]["ratio_p50"] > 0
