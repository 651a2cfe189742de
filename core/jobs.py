"""Job kinds and statuses.

The lifecycle (queued -> running -> completed | failed | cancelled; queued -> cancelled;
running -> queued for a retry or a reclaimed lease) is enforced by the compare-and-set
updates in ``storage/repositories/jobs.py``, the only place a status changes.
"""

from __future__ import annotations

import enum


class JobKind(enum.StrEnum):
    SPEECH = "speech"
    VIDEO = "video"


class JobStatus(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED})
