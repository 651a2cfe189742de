"""API metrics, served at ``/metrics``."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

JOBS_SUBMITTED = Counter("omnijobs_jobs_submitted_total", "Jobs accepted by the API",
                         ["kind", "model"])
PUBLISH_DEFERRED = Counter("omnijobs_publish_deferred_total",
                           "Jobs whose broker publish failed and was left to the relay")
# Requests waiting on a job right now: ``wait`` (synchronous speech), ``events`` (SSE job
# events), ``stream`` (streamed speech). Each is an asyncio wait, not a thread.
# With `api --workers N`, the sum over the live processes.
LIVE_ACTIVE = Gauge("omnijobs_live_active", "Requests waiting on or streaming a job",
                    ["kind"], multiprocess_mode="livesum")
for _kind in ("wait", "events", "stream"):
    LIVE_ACTIVE.labels(_kind)  # at 0 from the start, not from the first use
# Labelled by the matched route's path template (``/v1/jobs/{job_id}``), never the raw
# path, so ids cannot grow the label set; a path that matches no route is "unmatched".
# The buckets reach past the synchronous speech wait (60 s by default, at most 300 s).
REQUEST_LATENCY = Histogram(
    "omnijobs_http_request_duration_seconds", "API request latency, by route and status",
    ["method", "route", "status"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300))
