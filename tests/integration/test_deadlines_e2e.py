"""Deadlines with real workers: a job not started by its start deadline ends
``expired`` and never runs; one past its ``max_run_s`` (or ``Cancel-After``) ends
``cancelled`` with ``deadline_exceeded``, and the worker that ran it keeps running; on
``/v1/videos`` both read ``failed`` with the reason as the code; bad values are 400s
naming the field."""

from __future__ import annotations

import uuid

import pytest

from .helpers import assert_openai_error, wait_job

ASYNC = {"Prefer": "respond-async"}
ENDED = {"completed", "failed", "cancelled", "expired"}


def ended(job: dict) -> bool:
    return job["status"] in ENDED


@pytest.fixture
def client(stack):
    with stack.client(stack.new_key("deadline-" + uuid.uuid4().hex[:8])) as c:
        yield c


def test_a_job_not_started_in_time_expires_and_never_runs(client):
    """test-slow has no worker here: the job waits past its deadline."""
    job = client.post("/v1/audio/speech", headers=ASYNC, json={
        "model": "test-slow", "input": "Never said.", "start_within_s": 1}).json()
    assert job["status"] == "queued" and job["start_by"] >= job["created_at"]
    done = wait_job(client, job["id"], 30, until=ended)
    assert done["status"] == "expired" and done["attempts"] == 0
    assert done["error"]["code"] == "start_deadline_exceeded"
    assert done["outputs"] == [] and done["started_at"] is None
    listed = client.get("/v1/jobs", params={"status": "expired"}).json()["data"]
    assert [j["id"] for j in listed] == [job["id"]]


def test_past_max_run_s_the_job_is_cancelled_and_the_worker_lives_on(stack, client):
    worker_log = stack.processes["worker"].log
    starts = worker_log.read_text().count(" ready.")
    job = client.post("/v1/audio/speech", headers={**ASYNC, "Cancel-After": "1s"},
                      json={"model": "test-sleep", "input": "30"}).json()
    assert job["max_run_s"] == 1.0
    done = wait_job(client, job["id"], 30, until=ended)
    assert done["status"] == "cancelled" and done["error"]["code"] == "deadline_exceeded"
    assert done["attempts"] == 1 and done["usage"]["render_seconds"] >= 1.0
    assert done["usage"]["failed_render_seconds"] == done["usage"]["render_seconds"]
    after = client.post("/v1/audio/speech", headers=ASYNC,
                        json={"model": "test-sleep", "input": "0.1"}).json()
    assert wait_job(client, after["id"], 30)["status"] == "completed"
    assert worker_log.read_text().count(" ready.") == starts  # not recycled


def test_a_video_past_its_deadline_reads_failed_with_the_reason(client):
    video = client.post("/v1/videos", json={"model": "test-video-slow", "prompt": "ok",
                                            "max_run_s": 1}).json()
    done = wait_job(client, video["id"], 30, until=ended)
    assert done["status"] == "cancelled"  # the job's own status
    seen = client.get(f"/v1/videos/{video['id']}").json()
    assert seen["status"] == "failed" and seen["error"]["code"] == "deadline_exceeded"


@pytest.mark.parametrize(("body", "headers", "param"), [
    ({"start_within_s": -1}, {}, "start_within_s"),
    ({"start_within_s": "soon"}, {}, "start_within_s"),
    ({"max_run_s": 0}, {}, "max_run_s"),
    ({"max_run_s": 90000}, {}, "max_run_s"),
    ({"max_run_s": 3000}, {}, "max_run_s"),  # past the pipeline's 900 s
    ({}, {"Cancel-After": "soon"}, "Cancel-After"),
    ({"max_run_s": 5}, {"Cancel-After": "10s"}, "Cancel-After"),
])
def test_bad_deadlines_are_400s_naming_the_field(client, body, headers, param):
    resp = client.post("/v1/audio/speech", headers={**ASYNC, **headers},
                       json={"model": "test-sleep", "input": "1", **body})
    assert assert_openai_error(resp, 400)["param"] == param


def test_a_waited_on_job_that_a_deadline_ends_is_a_409_with_the_reason(client):
    resp = client.post("/v1/audio/speech", headers={"Prefer": "wait=30"},
                       json={"model": "test-sleep", "input": "30", "max_run_s": 1})
    assert assert_openai_error(resp, 409, "deadline_exceeded")
