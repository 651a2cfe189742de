"""Cancelling a batch mid-run, and a batch outliving its completion window: unfinished
jobs are cancelled (or, past the window, expired), finished results stay, and every count
matches the files."""

from __future__ import annotations

import io
import time

import pytest
from sqlalchemy import text

from ..webhooks.receiver import verify
from .conftest import batch_jobs, jsonl, results, speech_line, video_line, wait_batch


def submit(sdk, endpoint: str, lines: list[dict]):
    source = sdk.files.create(file=("in.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    return sdk.batches.create(input_file_id=source.id, endpoint=endpoint,
                              completion_window="24h")


def assert_accounted(sdk, done, total: int) -> tuple[list[dict], list[dict]]:
    """Every request in exactly one of the two files, and the counts say so."""
    ok, bad = results(sdk, done.output_file_id), results(sdk, done.error_file_id)
    counts = done.request_counts
    assert counts.total == total == len(ok) + len(bad)
    assert (counts.completed, counts.failed) == (len(ok), len(bad))
    assert len({x["custom_id"] for x in ok + bad}) == total
    return ok, bad


def test_cancel_mid_run_keeps_exact_counts(sdk, client, db):
    """Slow videos, one worker: cancel once one finished and another is rendering."""
    lines = [video_line(f"clip-{i}", model="test-video-slow") for i in range(6)]
    batch = submit(sdk, "/v1/videos", lines)
    wait_batch(sdk, batch.id, until=lambda b: b.request_counts.completed >= 1
               and batch_jobs(db, b.id).get("running") == 1, timeout=90)
    cancelled = sdk.batches.cancel(batch.id)
    assert cancelled.status in ("cancelling", "cancelled") and cancelled.cancelling_at
    jobs = batch_jobs(db, batch.id)
    assert set(jobs) <= {"completed", "cancelled"}, jobs  # queued and running: at once
    done = wait_batch(sdk, batch.id)
    assert done.status == "cancelled" and done.cancelled_at
    ok, bad = assert_accounted(sdk, done, 6)
    assert len(ok) == jobs["completed"] and len(bad) == jobs["cancelled"] >= 4
    for line in bad:
        assert line["error"]["code"] == "batch_cancelled"
        video = client.get(f"/v1/videos/{line['response']['request_id']}").json()
        # OpenAI's four statuses: a cancelled video is failed, saying why
        assert video["status"] == "failed" and video["error"]["code"] == "cancelled"
        assert video["outputs"] == []
    time.sleep(3.5)  # the running clip would have finished by now had it kept rendering
    assert batch_jobs(db, batch.id) == jobs
    assert sdk.batches.retrieve(batch.id).request_counts == done.request_counts
    again = client.post(f"/v1/batches/{batch.id}/cancel")
    assert again.status_code == 200 and again.json()["status"] == "cancelled"


def test_a_finished_batch_cannot_be_cancelled(sdk, client):
    done = wait_batch(sdk, submit(sdk, "/v1/audio/speech", [speech_line("a", input="Hi.")]).id)
    assert done.status == "completed"
    resp = client.post(f"/v1/batches/{done.id}/cancel")
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "batch_not_cancellable"


def test_expired_batch_expires_the_rest_and_keeps_what_finished(sdk, db, receiver, client):
    """test-slow has no worker here: its lines wait until the window closes, then end
    ``expired`` (OpenAI's ``batch_expired`` lines in the error file); the batch's usage
    is the sum of its finished jobs'."""
    endpoint = sdk.webhooks.create(name="expiry", url=receiver.url("/expired"),
                                   event_types=["batch.expired"])
    lines = [speech_line("fast-0", input="Done in time."),
             speech_line("slow-0", model="test-slow", input="never rendered"),
             speech_line("fast-1", input="Also done in time."),
             speech_line("slow-1", model="test-slow", input="never rendered either")]
    batch = submit(sdk, "/v1/audio/speech", lines)
    wait_batch(sdk, batch.id, until=lambda b: b.request_counts.completed == 2, timeout=90)
    assert sdk.batches.retrieve(batch.id).status == "in_progress"
    with db.begin() as conn:  # the 24 hours pass
        conn.execute(text("UPDATE batches SET expires_at = now() - interval '1 second' "
                          "WHERE id = :b"), {"b": batch.id})
    done = wait_batch(sdk, batch.id)
    assert done.status == "expired" and done.expired_at and done.finalizing_at
    ok, bad = assert_accounted(sdk, done, 4)
    assert [x["custom_id"] for x in ok] == ["fast-0", "fast-1"]
    assert [(x["custom_id"], x["error"]["code"]) for x in bad] == [
        ("slow-0", "batch_expired"), ("slow-1", "batch_expired")]
    assert batch_jobs(db, batch.id) == {"completed": 2, "expired": 2}
    shown = client.get(f"/v1/batches/{batch.id}").json()
    usage, tokens = shown["render_usage"], shown["usage"]
    jobs = [x["response"]["body"]["usage"] for x in ok]
    assert tokens["input_tokens"] == sum(u["characters"] for u in jobs) > 0
    assert tokens["total_tokens"] == tokens["input_tokens"] + tokens["output_tokens"] > 0
    assert usage["render_seconds"] == pytest.approx(sum(u["render_seconds"] for u in jobs))
    assert usage["bytes"] == sum(u["bytes"] for u in jobs) > 0
    assert usage["attempts"] == 2
    event = verify(receiver.wait_for("/expired")[0], endpoint.signing_secret)
    assert (event["type"], event["data"]["id"], event["data"]["status"]) == (
        "batch.expired", batch.id, "expired")
