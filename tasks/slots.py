"""A worker's engine slots: how many jobs it keeps in flight on its one engine.

An inference engine decodes many sequences per step for little more than the cost of
one (vLLM-Omni's Audex deploys hold 8), so a worker that sends one job at a time leaves
most of its GPU idle. The worker runs ``slots`` render threads (Celery's threads pool,
prefetch 1), all feeding the one engine the process built, and each render takes a
slot before it claims a job: a worker never holds a job it cannot start at once.

A guided job (``cfg_scale`` > 1) brings an unconditional companion sequence, so it
holds two slots. It learns that only after its claim, and takes the second slot
without waiting for it: threads that each held one slot and waited for a second could
wait on each other forever. The engine holds the one sequence over its limit in its
own queue, and no thread takes another slot until the count is below the total again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

WAKE_S = 0.5  # a thread waiting for a slot checks this often whether the worker drains


class SlotGate:
    def __init__(self, total: int) -> None:
        if total < 1:
            raise ValueError("a worker needs at least one slot")
        self.total = total
        self.busy = 0
        self._changed = threading.Condition()

    def take(self, stop: Callable[[], bool] = lambda: False) -> bool:
        """One slot, waiting until one is free; False (nothing taken) once ``stop``
        says so (the worker drains: the message goes back to its queue)."""
        with self._changed:
            while not stop():
                if self.busy < self.total:
                    self.busy += 1
                    return True
                self._changed.wait(WAKE_S)
            return False

    def grow(self, n: int) -> int:
        """``n`` more slots for the job already holding one, at once (see the module's
        docstring); returns ``n``."""
        with self._changed:
            self.busy += max(0, n)
        return max(0, n)

    def give(self, n: int) -> None:
        with self._changed:
            self.busy -= n
            self._changed.notify_all()
