"""A synchronous wait asks for its result to be handed over before the route commits the
job: a worker that finishes fast records the completion and looks for a process that
expects the result; if the ask came later, the result was read from the store after all
(and a process that cannot reach the store failed the request)."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

from api.live import watching
from api.live_hub import Live
from storage.bus import Bus, Watcher


class IdleWatcher(Watcher):
    async def _run(self) -> None:
        await asyncio.Event().wait()


class SlowBus(Bus):
    """Arranging the hand-over takes a moment (a Redis round trip on a busy host)."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.expected: list[str] = []
        self.done = threading.Event()

    def expect_result(self, job_id: str, ttl_s: float) -> None:
        time.sleep(self.delay_s)
        self.expected.append(job_id)
        self.done.set()


def _enter(bus: SlowBus) -> tuple[list[str], float, bool]:
    """What the bus had been asked to expect when ``watching`` let the route go on, how
    long that took, and whether the ask was made at all (the loop kept running, as a
    server's does)."""
    async def run() -> tuple[list[str], float, bool]:
        svc = SimpleNamespace(live=Live(bus, IdleWatcher()))
        started = time.monotonic()
        async with watching(svc, "job_fast", 30):
            expected = list(bus.expected)  # the route commits and enqueues here
            took = time.monotonic() - started
        asked = await asyncio.get_running_loop().run_in_executor(None, bus.done.wait, 10)
        return expected, took, asked
    return asyncio.run(run())


def test_the_handoff_is_arranged_before_the_route_commits_the_job():
    bus = SlowBus(delay_s=0.05)
    expected, _, asked = _enter(bus)
    assert expected == ["job_fast"] and asked


def test_a_bus_that_does_not_answer_delays_the_submit_only_briefly():
    """A frozen broker must not hold every synchronous submit: after a short bound the
    wait goes on without the hand-over (it reads the store at the end, as before)."""
    bus = SlowBus(delay_s=5)
    expected, took, asked = _enter(bus)
    assert expected == [] and took < 4
    assert asked  # the ask still ran, in the background
