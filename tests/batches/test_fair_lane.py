"""The bulk lane, against real Redis and a real worker: an interactive job submitted while
10,000 batch jobs wait is the next job the worker takes."""

from __future__ import annotations

import base64
import io
import json
import time
from datetime import UTC, datetime

import redis
from sqlalchemy import text

from ..integration.helpers import wait_job
from .conftest import batch_jobs, jsonl, speech_line, start_worker, wait_batch

LINES = 10_000
BULK_KEY = "pipeline.test-lane\x06\x169"  # kombu's list for priority 9 of that queue


def interactive(client, label: str) -> tuple[str, datetime]:
    resp = client.post("/v1/audio/speech", headers={"Prefer": "respond-async"},
                       json={"model": "test-lane", "input": label})
    assert resp.status_code == 202, resp.text
    return resp.json()["id"], datetime.now(UTC)


def started_at(db, job_id: str) -> datetime:
    with db.connect() as conn:
        return conn.execute(text("SELECT started_at FROM jobs WHERE id = :j"),
                            {"j": job_id}).scalar_one()


def batch_claims_between(db, batch_id: str, after: datetime, before: datetime) -> int:
    with db.connect() as conn:
        return conn.execute(text(
            "SELECT count(*) FROM jobs WHERE batch_id = :b AND started_at > :a "
            "AND started_at < :z"), {"b": batch_id, "a": after, "z": before}).scalar_one()


def test_interactive_jobs_overtake_a_long_batch_queue(batch_stack, sdk, client, db):
    broker = redis.Redis.from_url(batch_stack.env["OMNIJOBS_BROKER_URL"])
    lines = [speech_line(f"bulk-{i}", model="test-lane", input="x") for i in range(LINES)]
    source = sdk.files.create(file=("bulk.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    batch = sdk.batches.create(input_file_id=source.id, endpoint="/v1/audio/speech",
                               completion_window="24h")
    wait_batch(sdk, batch.id, until=lambda b: b.status == "in_progress", timeout=120)
    deadline = time.monotonic() + 60
    while broker.llen(BULK_KEY) < LINES and time.monotonic() < deadline:
        time.sleep(0.2)
    # Every batch job waits in the bulk lane (the outbox relay may have sent a few of them
    # a second time: harmless, the second claim finds the job taken).
    waiting = {json.loads(base64.b64decode(json.loads(m)["body"]))[0][0]
               for m in broker.lrange(BULK_KEY, 0, -1)}
    assert len(waiting) == LINES and broker.llen("pipeline.test-lane") == 0

    # A worker starts with 10,000 bulk messages and one interactive message waiting.
    first, _ = interactive(client, "submitted after ten thousand")
    lane = start_worker(batch_stack, "lane", "test-lane")
    try:
        assert wait_job(client, first, 60)["status"] == "completed"
        with db.connect() as conn:
            early = conn.execute(text("SELECT count(*) FROM jobs WHERE batch_id = :b AND "
                                      "started_at < :t"),
                                 {"b": batch.id, "t": started_at(db, first)}).scalar_one()
        assert early == 0  # the interactive job was the first one taken

        # And while it works through the batch, a new interactive job is next.
        wait_batch(sdk, batch.id, until=lambda b: b.request_counts.completed >= 3, timeout=60)
        second, sent = interactive(client, "submitted mid-batch")
        assert wait_job(client, second, 60)["status"] == "completed"
        assert batch_claims_between(db, batch.id, sent, started_at(db, second)) <= 1
    finally:
        sdk.batches.cancel(batch.id)
        lane.stop()
    done = wait_batch(sdk, batch.id, timeout=120)
    jobs = batch_jobs(db, batch.id)
    assert done.status == "cancelled" and set(jobs) <= {"completed", "cancelled"}
    counts = done.request_counts
    assert (counts.total, counts.completed, counts.failed) == (
        LINES, jobs["completed"], jobs["cancelled"])
    assert jobs["cancelled"] > LINES - 100
