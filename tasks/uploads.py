"""Uploads that outlast a store outage, and cleanup of uploads nobody will point at."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from core.errors import StorageFailed
from storage.bus import HANDOFF_MAX_BYTES
from storage.objects import ObjectStore
from storage.records import JobRecord

from .runtime import WorkerRuntime

log = logging.getLogger(__name__)

FIRST_DELAY_S, MAX_DELAY_S = 0.5, 5.0


class PatientStore:
    """The object store as finalize sees it. An upload that fails because the store is
    unreachable is retried in place for up to ``budget_s``, holding the rendered result
    and the lease (``guard`` heartbeats before every try and stops if the job is no
    longer ours): the accelerator's work is never redone because the store blinked.
    Remembers what it uploaded, for cleanup, and the bytes of small uploads, which a
    waiting request may be handed with the completion (storage/bus.py)."""

    def __init__(self, store: ObjectStore, guard: Callable[[], None], budget_s: float) -> None:
        self._store, self._guard, self._budget_s = store, guard, budget_s
        self.uploaded: set[str] = set()
        self.small: dict[str, bytes] = {}

    def put(self, key: str, data: bytes, content_type: str) -> None:
        deadline = time.monotonic() + self._budget_s
        delay = FIRST_DELAY_S
        while True:
            try:
                self._store.put(key, data, content_type)
                break
            except StorageFailed as exc:
                if time.monotonic() + delay > deadline:
                    raise
                log.warning("upload of %s failed (%s); retrying in %.1fs", key, exc.message,
                            delay)
                time.sleep(delay)
                delay = min(2 * delay, MAX_DELAY_S)
                self._guard()
        self.uploaded.add(key)
        if len(data) <= HANDOFF_MAX_BYTES:
            self.small[key] = data

    def __getattr__(self, name: str):
        return getattr(self._store, name)


def discard_uploads(rt: WorkerRuntime, job: JobRecord, keys: set[str]) -> None:
    """After an attempt that did not complete its job (finalize stopped, or the
    completing compare-and-set failed and ``complete`` saw no completion of ours): the
    objects it uploaded are under its own attempt's keys, which no record will ever name,
    whatever became of the job (gone, cancelled, failed, or another attempt's now), so
    they are deleted at once, not left for the hourly orphan sweep. A completion that
    could not be confirmed either way never gets here."""
    if not keys:
        return
    rt.store.delete(sorted(keys))
    log.info("job %s was not completed by attempt %d: deleted its %d uploaded objects",
             job.id, job.attempts, len(keys), extra={"job_id": job.id})
