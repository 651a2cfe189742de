"""Worker metrics, served by ``omnijobs worker --metrics-port``."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

JOBS_FINISHED = Counter("omnijobs_jobs_finished_total", "Jobs a worker finished, by outcome",
                        ["pipeline", "outcome"])
GENERATE_SECONDS = Histogram("omnijobs_generate_seconds", "Pipeline generation time",
                             ["pipeline"], buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300))
FINALIZE_SECONDS = Histogram("omnijobs_finalize_seconds",
                             "Validate + encode/mux + probe + upload time", ["pipeline"],
                             buckets=(0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60))
