"""What a worker tells listening API processes: notices of a job's changes, and the
audio a speech job adds while someone streams it (storage/bus.py carries both).

Nothing here may fail a job: the stream is a convenience beside the durable record, so
a bus that is down is logged and skipped (the API re-reads the database on a timer).
"""

from __future__ import annotations

import logging

import numpy as np

from media.audio import AudioAggregator
from storage.bus import Bus

log = logging.getLogger(__name__)


def notify(bus: Bus | None, job_id: str) -> None:
    if bus is None:
        return
    try:
        bus.notify(job_id)
    except Exception:
        log.warning("live notice for %s not sent", job_id, exc_info=True,
                    extra={"job_id": job_id})


class AudioTap:
    """Sends each chunk's new samples (``AudioAggregator.add``'s return value) once a
    listener exists. A listener that arrives late first gets everything aggregated so
    far in one chunk, so what it receives is always exactly the job's audio."""

    def __init__(self, bus: Bus | None, job_id: str, attempt: int) -> None:
        self.bus, self.job_id, self.attempt = bus, job_id, attempt
        self.live = False
        self.seq = 0

    def add(self, added: np.ndarray, aggregator: AudioAggregator) -> None:
        if self.bus is None:
            return
        try:
            if not self.live:
                if not self.bus.listening(self.job_id):
                    return
                self.live = True
                if aggregator.frames == 0:
                    return
                added = aggregator.result().samples
            if added.shape[1] == 0:
                return
            self.bus.add_audio(self.job_id, self.attempt, self.seq, added,
                               aggregator.sample_rate)
            self.seq += 1
        except Exception:
            log.warning("audio chunk of %s not streamed; streaming stops", self.job_id,
                        exc_info=True, extra={"job_id": self.job_id})
            self.bus = None
