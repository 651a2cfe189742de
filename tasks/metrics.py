"""Worker metrics, served by ``omnijobs worker --metrics-port``."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

JOBS_FINISHED = Counter("omnijobs_jobs_finished_total", "Jobs a worker finished, by outcome",
                        ["pipeline", "outcome"])
GENERATE_SECONDS = Histogram("omnijobs_generate_seconds", "Pipeline generation time",
                             ["pipeline"], buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300))
# Worker wall time in the pipeline, every attempt's (the same seconds each job's usage
# records). ``tenant`` is empty (no label, to Prometheus) unless OMNIJOBS_METRICS_TENANT_LABEL.
RENDER_SECONDS = Counter("omnijobs_render_seconds", "Worker wall time in the pipeline, "
                         "by pipeline (and tenant, if configured)", ["pipeline", "tenant"])
FINALIZE_SECONDS = Histogram("omnijobs_finalize_seconds",
                             "Validate + encode/mux + probe + upload time", ["pipeline"],
                             buckets=(0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60))
WEBHOOK_DELIVERIES = Counter("omnijobs_webhook_deliveries_total",
                             "Webhook delivery attempts, by outcome", ["outcome"])
WEBHOOK_LATENCY = Histogram("omnijobs_webhook_delivery_latency_seconds",
                            "From an event to its successful delivery",
                            buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 300, 1800, 7200, 86400))
WEBHOOK_REQUEST_SECONDS = Histogram("omnijobs_webhook_request_seconds",
                                    "Duration of one webhook HTTP attempt",
                                    buckets=(0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 15, 30))
