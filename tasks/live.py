"""What a worker tells listening API processes: notices of a job's changes, and the
audio a speech job adds while someone streams it (storage/bus.py carries both).

Nothing here may fail a job: the stream is a convenience beside the durable record, so
a bus that is down is logged and skipped (the API re-reads the database on a timer).
"""

from __future__ import annotations

import logging

import numpy as np

from media.audio import AudioAggregator
from storage.bus import Bus, Result

log = logging.getLogger(__name__)


def notify(bus: Bus | None, job_id: str, running: bool = False) -> None:
    """``running``: claimed, or progress recorded (``Bus.notify``)."""
    if bus is None:
        return
    try:
        bus.notify(job_id, running)
    except Exception:
        log.warning("live notice for %s not sent", job_id, exc_info=True,
                    extra={"job_id": job_id})


def hand_result(bus: Bus | None, result: Result) -> None:
    """The completed job's result to the process that waits for it, if one does, before
    the notice (which every watcher gets): a failure costs only the wait's own reads."""
    if bus is None:
        return
    try:
        bus.hand_result(result)
    except Exception:
        log.warning("result of %s not handed to its waiter", result.job_id, exc_info=True,
                    extra={"job_id": result.job_id})


class AudioTap:
    """Sends each chunk's new samples (``AudioAggregator.add``'s return value) once a
    listener exists. A listener that arrives late first gets everything aggregated so
    far in one chunk, and a write that failed is made up by the next one (which carries
    everything not yet sent), so what a listener receives is always exactly the job's
    audio, in order. After ``MAX_FAILURES`` failed writes in a row the tap gives up, so a
    bus that is down costs the accelerator nothing more; the API then sees a stream
    short of the stored output and says so."""

    MAX_FAILURES = 3

    def __init__(self, bus: Bus | None, job_id: str, attempt: int) -> None:
        self.bus, self.job_id, self.attempt = bus, job_id, attempt
        self.live = False
        self.seq = 0
        self.sent = 0  # frames of the aggregate the listener has
        self.failures = 0

    def add(self, added: np.ndarray, aggregator: AudioAggregator) -> None:
        if self.bus is None or not self._listened():
            return
        missing = aggregator.frames - self.sent
        if missing <= 0:
            return
        samples = added if missing == added.shape[1] else (
            aggregator.result().samples[:, self.sent:])
        try:
            self.bus.add_audio(self.job_id, self.attempt, self.seq, samples,
                               aggregator.sample_rate)
        except Exception:
            self._failed()
            return
        self.seq, self.sent, self.failures = self.seq + 1, aggregator.frames, 0

    def finish(self, aggregator: AudioAggregator) -> None:
        """After the last chunk: one more try at anything a failed write left unsent."""
        self.add(np.zeros((1, 0), np.float32), aggregator)

    def _listened(self) -> bool:
        if not self.live:
            try:
                self.live = self.bus.listening(self.job_id)
            except Exception:
                self._failed()
        return self.live

    def _failed(self) -> None:
        self.failures += 1
        give_up = self.failures >= self.MAX_FAILURES
        log.warning("audio of %s not streamed%s", self.job_id,
                    "; streaming stops" if give_up else "; the next chunk carries it",
                    exc_info=True, extra={"job_id": self.job_id})
        if give_up:
            self.bus = None
