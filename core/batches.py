"""Batch statuses and the limits of a batch (OpenAI's Batch API, for our endpoints).

The lifecycle: ``validating -> in_progress -> finalizing -> completed``;
``validating -> failed`` (the file itself is unusable); ``in_progress -> finalizing ->
expired`` (past the completion window); ``validating | in_progress -> cancelling ->
cancelled``. Each change is a compare-and-set in ``storage/repositories/batches.py``.
"""

from __future__ import annotations

import enum

ENDPOINTS = ("/v1/audio/speech", "/v1/videos")
COMPLETION_WINDOWS = {"24h": 24 * 3600}
MAX_CUSTOM_ID = 512


class BatchStatus(enum.StrEnum):
    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in BATCH_TERMINAL


BATCH_TERMINAL = frozenset({BatchStatus.FAILED, BatchStatus.COMPLETED, BatchStatus.EXPIRED,
                            BatchStatus.CANCELLED})
# What a finalizing batch becomes, and the webhook event it announces.
EVENTS = {BatchStatus.COMPLETED: "batch.completed", BatchStatus.FAILED: "batch.failed",
          BatchStatus.EXPIRED: "batch.expired", BatchStatus.CANCELLED: "batch.cancelled"}


def ending(status: BatchStatus, expired: bool) -> BatchStatus:
    """What a finalizing or cancelling batch becomes."""
    if status is BatchStatus.CANCELLING:
        return BatchStatus.CANCELLED
    return BatchStatus.EXPIRED if expired else BatchStatus.COMPLETED


# The render lane of a batch's jobs: their messages wait behind every interactive job.
BULK_LANE = "bulk"
