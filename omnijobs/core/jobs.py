"""Job kinds, statuses and the transitions between them.

The allowed-transition table lives here (not in the repository) so the API, the
workers and the tests all agree on one lifecycle; the repository enforces it with
compare-and-set updates.
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

# running -> queued happens only for a retry or a reclaimed lease.
ALLOWED = {
    JobStatus.QUEUED: frozenset({JobStatus.RUNNING, JobStatus.CANCELLED, JobStatus.FAILED}),
    JobStatus.RUNNING: frozenset(
        {JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.QUEUED}
    ),
    JobStatus.COMPLETED: frozenset(),
    JobStatus.FAILED: frozenset(),
    JobStatus.CANCELLED: frozenset(),
}


def can_transition(src: JobStatus, dst: JobStatus) -> bool:
    return dst in ALLOWED[src]
