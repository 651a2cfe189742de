"""The resync (one read of every watched job's state per interval) wakes only watchers
whose job is not as they last read it; one that has not read its job yet is left alone,
since its first read is still to come (a wake then would only cost a second read)."""

from __future__ import annotations

import asyncio
import threading

from api.live_hub import Live
from storage.bus import Bus, Watcher


class IdleWatcher(Watcher):
    async def _run(self) -> None:
        await asyncio.Event().wait()  # no notices: only the resync wakes anyone


def test_the_resync_wakes_a_watcher_whose_job_changed_and_no_unread_one():
    reads: list[list[str]] = []
    twice = threading.Event()

    def states(ids: list[str]) -> dict[str, tuple]:
        reads.append(sorted(ids))
        if len(reads) >= 2:
            twice.set()
        return {"job_a": ("queued", 0, 0), "job_b": ("running", 1, 5)}

    async def run() -> None:
        watcher = IdleWatcher()
        live = Live(Bus(), watcher, states=states, resync_s=0.01)
        with watcher.subscribe("job_a") as unread, watcher.subscribe("job_a") as same, \
                watcher.subscribe("job_b") as stale:
            same.seen = ("queued", 0, 0)
            stale.seen = ("queued", 0, 0)  # it last read job_b queued: now it runs
            live.ensure_resync()
            while not twice.is_set():
                await asyncio.sleep(0.01)
            assert stale.event.is_set() and stale.changed
            assert not same.event.is_set() and not same.changed
            assert not unread.event.is_set() and not unread.changed
        live._resync.cancel()

    asyncio.run(run())
    assert reads[0] == ["job_a", "job_b"]
