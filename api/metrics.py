"""API metrics, served at ``/metrics``."""

from __future__ import annotations

from prometheus_client import Counter

JOBS_SUBMITTED = Counter("omnijobs_jobs_submitted_total", "Jobs accepted by the API",
                         ["kind", "model"])
PUBLISH_DEFERRED = Counter("omnijobs_publish_deferred_total",
                           "Jobs whose broker publish failed and was left to the relay")
