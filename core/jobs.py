"""Job kinds and statuses.

The lifecycle (queued -> running -> completed | failed | cancelled; queued -> cancelled;
queued -> expired, or running -> expired right after a claim that came too late, when a
job's start deadline passed;
running -> queued for a retry or a reclaimed lease) is enforced by the compare-and-set
updates in ``storage/repositories/jobs.py``, the only place a status changes.
"""

from __future__ import annotations

import enum
import re

JOB_ID = re.compile(r"(?:job|video)_[0-9a-f]{32}")  # a kind's prefix + a UUID's hex


class JobKind(enum.StrEnum):
    SPEECH = "speech"
    VIDEO = "video"


class JobStatus(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"  # its start deadline passed before it started: it never ran

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED,
                      JobStatus.EXPIRED})


def is_job_id(value: str) -> bool:
    """Ids are not free text: anything else names no job, and is never sent to the
    database (where a NUL byte, say, is an error rather than a miss)."""
    return JOB_ID.fullmatch(value) is not None
