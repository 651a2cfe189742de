"""Batches in the fast-path table: a 50,000-line file from upload to every job queued.

The harness's own services (its API, a maintenance process that runs the batch step,
PostgreSQL, Redis, SeaweedFS; no render worker) take a 50,000-line ``/v1/audio/speech``
batch through the openai SDK exactly as ``bench.batch_enqueue`` does: upload, create,
then wait until the batch is ``in_progress`` and all its render messages are in the
Redis bulk lane. Reported as jobs/s (lines / seconds from the upload's start). The
breakdown and the one-by-one baseline stay in ``python -m bench.batch_enqueue``.
"""

from __future__ import annotations

import redis
from openai import OpenAI

from .batch_enqueue import enqueue
from .report import Figure

BATCH_LINES = 50_000
NAME = f"batch: {BATCH_LINES:,}-line file, upload → all queued, jobs/s"


def measure(base_url: str, key: str, redis_url: str, lines: int = BATCH_LINES) -> dict:
    sdk = OpenAI(base_url=base_url + "/v1", api_key=key, max_retries=0, timeout=600)
    broker = redis.Redis.from_url(redis_url)
    try:
        return enqueue(sdk, broker, lines)
    finally:
        broker.close()


def figure(data: dict, lines: int = BATCH_LINES) -> Figure:
    seconds = data["upload_to_all_queued_s"]
    return Figure(key="batch_upload", name=NAME, target="reported",
                  measured=f"{lines / seconds:,.0f} jobs/s ({seconds:.2f} s: upload "
                           f"{data['upload_s']:.2f} s, created → committed "
                           f"{data['created_to_jobs_committed_s']:.2f} s, committed → all "
                           f"in the bulk lane {data['committed_to_all_published_s']:.2f} s)",
                  data={**data, "lines": lines, "jobs_per_s": round(lines / seconds, 1)})
