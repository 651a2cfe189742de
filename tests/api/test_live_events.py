"""Job event streams in-process: heartbeats while idle, a bounded stream, the event ids
a client resumes from; nothing consumes the queue here, so the job stays queued."""

from __future__ import annotations

import pytest

from api.live import TERMINAL_ID, event_id, events_since
from core.jobs import JobStatus


@pytest.fixture
def live_api(make_api):
    return make_api(event_heartbeat_s=0.2, event_stream_max_s=1.0, event_resync_s=0.3)


def queued_job(client) -> str:
    resp = client.post("/v1/audio/speech", headers={"Prefer": "respond-async"},
                       json={"model": "tts-1", "input": "Waiting."})
    assert resp.status_code == 202, resp.text
    return resp.json()["id"]


def test_idle_stream_sends_heartbeats_and_ends_at_its_limit(live_api):
    with live_api.client("live-idle") as client:
        job_id = queued_job(client)
        resp = client.get(f"/v1/jobs/{job_id}/events")  # returns once the stream ends
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream")
    body = resp.text
    assert body.count("event: status") == 1 and f"id: {1000}\n" in body
    assert body.count(": keep-alive") >= 2  # every 0.2 s of a 1 s stream


def test_resuming_a_queued_job_sends_nothing_new(live_api):
    with live_api.client("live-resume") as client:
        job_id = queued_job(client)
        resp = client.get(f"/v1/jobs/{job_id}/events", headers={"Last-Event-ID": "1000"})
        assert "event:" not in resp.text and ": keep-alive" in resp.text
        bad = client.get(f"/v1/jobs/{job_id}/events", headers={"Last-Event-ID": "soon"})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_last_event_id"
        other = client.get(f"/v1/videos/{job_id}/events")
        assert other.status_code == 404


def test_streamed_speech_needs_an_encoder(live_api):
    """An app built without media/stream.py's encoder streams nothing: a clear 400."""
    with live_api.client("live-noenc") as client:
        resp = client.post("/v1/audio/speech", json={"model": "tts-1", "input": "hi",
                                                     "stream_format": "audio"})
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "unsupported_stream_format"


class Job:
    def __init__(self, status, attempts=0, progress=0):
        self.status, self.attempts, self.progress = JobStatus(status), attempts, progress


def test_event_ids_grow_through_retries():
    states = [Job("queued"), Job("running", 1, 0), Job("running", 1, 40),
              Job("queued", 1), Job("running", 2, 0), Job("running", 2, 99),
              Job("completed", 2, 100)]
    ids = [event_id(j) for j in states]
    assert ids == sorted(set(ids)) and ids[-1] == TERMINAL_ID


def test_events_since_names_progress_and_output():
    def present(_job):
        from pydantic import BaseModel

        class Body(BaseModel):
            ok: bool = True
        return Body()
    def kinds(job, last):
        return [d.split(b"\n")[1] for _, d in events_since(job, last, present)]
    assert kinds(Job("running", 1, 50), 1001) == [b"event: progress"]
    assert kinds(Job("running", 2, 0), 1050) == [b"event: status"]  # a new attempt
    assert kinds(Job("running", 1, 50), 1000) == [b"event: status"]
    assert kinds(Job("completed", 1, 100), 1051) == [b"event: status", b"event: output"]
    assert kinds(Job("completed", 1, 100), TERMINAL_ID) == [b"event: output"]
    assert kinds(Job("failed", 1, 10), TERMINAL_ID) == []


def test_a_stream_whose_bus_is_down_answers_202(make_api):
    """The job exists once the stream would start: a bus that fails then is a 202 with the
    job (never an error that invites a resubmit)."""
    from media.stream import STREAMABLE, stream_encoder

    api = make_api()
    api.services.stream_encoder, api.services.streamable = stream_encoder, STREAMABLE

    def down(_job_id):
        raise ConnectionError("bus down")
    api.services.live.bus.listen = down
    with api.client("live-busdown") as client:
        resp = client.post("/v1/audio/speech", json={"model": "tts-1", "input": "hi",
                                                     "stream_format": "audio"})
    assert resp.status_code == 202, resp.text
    assert resp.json()["status"] == "queued" and resp.headers["location"].startswith("/v1/jobs/")
