"""The fleet's gauges from what the database and the registry say: slots counted, and a
job that left the engine (mux, upload) reported as finalizing, not running."""

from __future__ import annotations

from datetime import UTC, datetime

from storage.records import LaneSignals, QueueSignals, SlotCount
from tasks.fleet import families


def gauges(running: dict[str, int], slots: dict[str, SlotCount]
           ) -> dict[tuple[str, str], float]:
    now = datetime.now(UTC)
    signals = QueueSignals(at=now, window_s=60, running=running, lanes=tuple(
        LaneSignals(p, "interactive", 8, now, 0) for p in running))
    return {(f.name, s.labels.get("pipeline", "")): s.value
            for f in families(signals, slots) for s in f.samples}


def test_slots_are_counted_and_finalizing_jobs_are_not_running():
    """Two Audex workers of 8 slots, 7 held; the database has 5 jobs running, 2 of which
    only wait for their upload: 3 running, 2 finalizing. A video pipeline no worker
    serves shows zeros, not gaps."""
    got = gauges({"audex-tts": 5, "minimax-h3": 0},
                 {"audex-tts": SlotCount(workers=2, slots=16, busy=7, finalizing=2),
                  "minimax-h3": SlotCount()})
    assert got[("omnijobs_jobs_running", "audex-tts")] == 3
    assert got[("omnijobs_jobs_finalizing", "audex-tts")] == 2
    assert got[("omnijobs_workers", "audex-tts")] == 2
    assert got[("omnijobs_worker_slots", "audex-tts")] == 16
    assert got[("omnijobs_slots_busy", "audex-tts")] == 7
    assert [got[(name, "minimax-h3")] for name in (
        "omnijobs_jobs_running", "omnijobs_jobs_finalizing", "omnijobs_workers",
        "omnijobs_worker_slots", "omnijobs_slots_busy")] == [0, 0, 0, 0, 0]


def test_a_registry_ahead_of_the_database_never_makes_running_negative():
    """A row that still lists a finalizing job the database already recorded (the row is
    up to a heartbeat behind): running stays 0 and finalizing at most what runs."""
    got = gauges({"audex-tts": 1},
                 {"audex-tts": SlotCount(workers=1, slots=8, busy=0, finalizing=3)})
    assert got[("omnijobs_jobs_running", "audex-tts")] == 0
    assert got[("omnijobs_jobs_finalizing", "audex-tts")] == 1
