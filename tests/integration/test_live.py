"""Live results end to end: job event streams (SSE) and streamed speech, over the real
stack (API processes, worker, PostgreSQL, Redis, SeaweedFS)."""

from __future__ import annotations

import base64
import json

import httpx
import pytest
from openai import OpenAI

from ..services import free_port, spawn, wait_until
from .helpers import decode, wait_job

TEXT = "Streaming speech arrives while the job is still running. Nothing is lost."
SLOW_AUDEX = ("[slow] the delta engine sends only the audio decoded since its last output "
              "so each sample is sent once")
AUDEX = "nvidia/Nemotron-Labs-Audex-2B"
TERMINAL_ID = 1_000_000_000


def slack_s(fmt: str, rate: int) -> float:
    """How far a streamed file's decoded length may be from the stored one's: MP3 keeps its
    codec delay and padding (no LAME header in a pipe), the others are within a frame."""
    return (1105 + 1152 + 1) / rate if fmt == "mp3" else 0.03


def sse_events(resp: httpx.Response) -> list[dict]:
    """Parse a text/event-stream body into {id, event, data} dicts (comments dropped)."""
    events, current = [], {}
    for line in resp.iter_lines():
        if not line:
            if "data" in current:
                events.append(current)
            current = {}
        elif not line.startswith(":") and ":" in line:
            field, _, value = line.partition(":")
            current[field] = value.removeprefix(" ")
    return events


def events_of(client: httpx.Client, path: str, last_id: str | None = None) -> list[dict]:
    headers = {"Last-Event-ID": last_id} if last_id is not None else {}
    with client.stream("GET", path, headers=headers, timeout=60) as resp:
        assert resp.status_code == 200, resp.read()
        assert resp.headers["content-type"].startswith("text/event-stream")
        return sse_events(resp)


@pytest.fixture(scope="module")
def key(stack) -> str:
    return stack.new_key("live")


@pytest.fixture(scope="module")
def client(stack, key):
    with stack.client(key) as c:
        yield c


@pytest.fixture(scope="module")
def second_api(stack):
    """Another API process of the same deployment whose only way to hear of a change in
    time is a notice through Redis: its database resync is a minute away."""
    port = free_port()
    env = dict(stack.env, OMNIJOBS_EVENT_RESYNC_S="60")
    home = stack.processes["api"].log.parent
    proc = spawn("api-2", ["api", "--port", str(port)], env, home)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: httpx.get(f"{base}/readyz", timeout=2).status_code == 200, 60,
                   "second API")
        yield base
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def audex_worker(stack):
    proc = spawn("live-audex-worker", ["worker", "--pipeline", "audex-tts"], stack.env,
                 stack.processes["worker"].log.parent)
    wait_until(lambda: "ready" in proc.log.read_text(), 120, "audex worker")
    yield proc
    proc.stop()


def submit(client: httpx.Client, model: str, text: str, fmt: str = "wav") -> str:
    resp = client.post("/v1/audio/speech", headers={"Prefer": "respond-async"},
                       json={"model": model, "input": text, "response_format": fmt})
    assert resp.status_code == 202, resp.text
    return resp.json()["id"]


def test_events_of_a_completed_job_then_resumed(client):
    job_id = submit(client, "test-stream", "tone")
    everything = events_of(client, f"/v1/jobs/{job_id}/events")
    # A ``queue`` event (while the job waits) carries no id: no state to resume from.
    assert all("id" not in e for e in everything if e["event"] == "queue")
    events = [e for e in everything if e["event"] != "queue"]
    ids = [int(e["id"]) for e in events]
    assert ids == sorted(set(ids)), ids  # strictly growing: nothing sent twice
    kinds = [e["event"] for e in events]
    assert kinds[-2:] == ["status", "output"], kinds
    assert "progress" in kinds  # the worker's progress reached the stream as it ran
    final = json.loads(events[-1]["data"])
    assert json.loads(events[-2]["data"])["status"] == "completed" == final["status"]
    assert final["id"] == job_id and final["progress"] == 100
    assert final["status"] == "completed" and final["outputs"][0]["url"].startswith("http")
    assert httpx.get(final["outputs"][0]["url"]).status_code == 200
    # a client that connects after the end gets the final state at once...
    late = events_of(client, f"/v1/jobs/{job_id}/events")
    assert [e["event"] for e in late] == ["status", "output"]
    # ...and one that resumes gets only what it has not seen
    resumed = events_of(client, f"/v1/jobs/{job_id}/events", last_id=events[-2]["id"])
    assert [(e["event"], e["id"]) for e in resumed] == [("output", events[-1]["id"])]
    assert events_of(client, f"/v1/jobs/{job_id}/events", last_id=events[-1]["id"]) == []


def test_resuming_mid_job_skips_what_was_seen(client):
    job_id = submit(client, "test-stream", "tone")
    with client.stream("GET", f"/v1/jobs/{job_id}/events") as resp:
        lines = resp.iter_lines()
        first = {}
        for line in lines:
            if not line and "id" in first:
                break
            if line.startswith(("id:", "event:")):
                name, _, value = line.partition(": ")
                first[name] = value
    rest = events_of(client, f"/v1/jobs/{job_id}/events", last_id=first["id"])
    assert rest and all(int(e["id"]) > int(first["id"]) for e in rest)
    assert json.loads(rest[-1]["data"])["status"] == "completed"


def test_events_of_failed_and_cancelled_jobs(client):
    failed = submit(client, "test-silent", "Nothing to hear.")
    last = events_of(client, f"/v1/jobs/{failed}/events")[-1]
    assert last["event"] == "status" and int(last["id"]) == TERMINAL_ID
    body = json.loads(last["data"])
    assert body["status"] == "failed" and body["error"]["code"] == "silent_audio"

    slow = submit(client, "test-sleep", "20")
    with client.stream("GET", f"/v1/jobs/{slow}/events") as resp:
        seen = []
        for event in _iter_events(resp):
            seen.append(event)
            if event["event"] == "status" and json.loads(event["data"])["status"] == "running":
                assert client.post(f"/v1/jobs/{slow}/cancel").status_code == 200
    assert json.loads(seen[-1]["data"])["status"] == "cancelled"
    assert seen[-1]["event"] == "status"


def _iter_events(resp: httpx.Response):
    current = {}
    for line in resp.iter_lines():
        if not line:
            if "data" in current:
                yield current
            current = {}
        elif not line.startswith(":") and ":" in line:
            name, _, value = line.partition(":")
            current[name] = value.removeprefix(" ")


def test_a_stream_served_by_another_api_process(client, second_api, key):
    """Submitted through one API, watched (and waited on) through another, which hears
    of the worker's changes only through Redis notices."""
    job_id = submit(client, "test-stream", "tone")
    with httpx.Client(base_url=second_api, headers={"Authorization": f"Bearer {key}"},
                      timeout=30) as other:
        events = events_of(other, f"/v1/jobs/{job_id}/events")
        assert json.loads(events[-1]["data"])["status"] == "completed"
        assert "progress" in [e["event"] for e in events]
        # the synchronous wait is pushed too: done long before a one-minute resync
        resp = other.post("/v1/audio/speech", json={"model": "test-stream", "input": "x",
                                                    "response_format": "wav"})
        assert resp.status_code == 200 and decode(resp.content, "wav").duration_s == 1.5
        video = other.get(f"/v1/videos/{job_id}/events")
        assert video.status_code == 404  # a speech job is not a video


@pytest.mark.parametrize("fmt", ["pcm", "wav", "mp3", "aac", "opus", "flac"])
def test_sdk_streams_audio_in_each_format(stack, key, client, fmt):
    sdk = OpenAI(base_url=f"{stack.base_url}/v1", api_key=key, max_retries=0)
    with sdk.audio.speech.with_streaming_response.create(
            model="tts-1", voice="alloy", input=TEXT, response_format=fmt,
            stream_format="audio") as resp:
        job_id = resp.headers["x-job-id"]
        data = b"".join(resp.iter_bytes())
    job = wait_job(client, job_id)
    assert job["status"] == "completed", job
    out = job["outputs"][0]
    streamed = decode(data, fmt, out["sample_rate"])
    assert streamed.sample_rate == out["sample_rate"]
    # the same audio as the stored output
    assert abs(streamed.duration_s - out["duration_s"]) < slack_s(fmt, out["sample_rate"])


@pytest.mark.parametrize("fmt", ["pcm", "wav", "mp3", "aac", "opus", "flac"])
def test_sdk_streams_sse_events(stack, key, client, fmt):
    sdk = OpenAI(base_url=f"{stack.base_url}/v1", api_key=key, max_retries=0)
    with sdk.audio.speech.with_streaming_response.create(
            model="tts-1", voice="alloy", input=TEXT, response_format=fmt,
            stream_format="sse") as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        job_id = resp.headers["x-job-id"]
        lines = [line for line in resp.iter_lines() if line.startswith("data: ")]
    events = [json.loads(line.removeprefix("data: ")) for line in lines]
    assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1)
    assert events[-1]["type"] == "speech.audio.done" and "usage" in events[-1]
    data = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    out = wait_job(client, job_id)["outputs"][0]
    got = decode(data, fmt, out["sample_rate"])
    assert abs(got.duration_s - out["duration_s"]) < slack_s(fmt, out["sample_rate"])


def test_first_bytes_arrive_while_the_job_runs(stack, key, client):
    sdk = OpenAI(base_url=f"{stack.base_url}/v1", api_key=key, max_retries=0)
    with sdk.audio.speech.with_streaming_response.create(
            model="test-stream", voice="alloy", input="x", response_format="pcm",
            stream_format="audio") as resp:
        chunks = resp.iter_bytes()
        first = next(chunks)
        assert first
        job = client.get(f"/v1/jobs/{resp.headers['x-job-id']}").json()
        assert job["status"] == "running", job
        data = first + b"".join(chunks)
    assert decode(data, "pcm").duration_s == pytest.approx(1.5, abs=0.01)


@pytest.mark.parametrize("fmt", ["wav", "pcm"])
def test_engine_deltas_stream_each_sample_once(stack, key, client, audex_worker, fmt):
    """The fake Audex engine sends DELTA outputs (several chunks at a time, as vLLM-Omni
    does): the stream is exactly the stored audio, sample for sample (no repeats, nothing
    cut)."""
    with client.stream("POST", "/v1/audio/speech", json={
            "model": AUDEX, "input": SLOW_AUDEX, "voice": "default", "response_format": fmt,
            "stream_format": "audio"}) as resp:
        assert resp.status_code == 200, resp.read()
        job_id = resp.headers["x-job-id"]
        pieces = list(resp.iter_bytes())
    job = wait_job(client, job_id)
    assert len(pieces) > 2  # it did arrive in pieces
    stored = client.get(f"/v1/jobs/{job_id}/content").content
    if fmt == "pcm":
        assert b"".join(pieces) == stored
    else:  # the same samples; only the header's sizes differ (open-ended when streamed)
        got, want = decode(b"".join(pieces), fmt), decode(stored, fmt)
        assert got.samples.shape == want.samples.shape
        assert (got.samples == want.samples).all()
    assert job["outputs"][0]["duration_s"] == pytest.approx(got_duration(pieces, fmt), abs=1e-3)


def got_duration(pieces: list[bytes], fmt: str) -> float:
    return decode(b"".join(pieces), fmt).duration_s


def test_a_stream_whose_job_fails_ends_with_an_error(client):
    """Silent audio streams, then fails final validation: the job is recorded failed, an
    SSE stream ends with an error event and an audio stream is cut short (or, if the job
    failed before its audio was read, the answer is the job's error)."""
    body = {"model": "test-silent", "input": "quiet", "response_format": "wav"}
    with client.stream("POST", "/v1/audio/speech", json=body | {"stream_format": "sse"}) as r:
        if r.status_code == 200:
            last = [line for line in r.iter_lines() if line.startswith("data: ")][-1]
            error = json.loads(last.removeprefix("data: "))
            assert error["type"] == "error" and "silent" in error["error"]["message"]
        else:
            assert r.status_code == 500 and r.read() and r.json()["error"]["code"] == "silent_audio"
        job_id = r.headers["x-job-id"] if r.status_code == 200 else None
    if job_id:
        job = wait_job(client, job_id)
        assert job["status"] == "failed" and job["error"]["code"] == "silent_audio"
    with client.stream("POST", "/v1/audio/speech", json=body | {"stream_format": "audio"}) as r:
        if r.status_code == 200:
            with pytest.raises(httpx.RemoteProtocolError):
                r.read()
        else:
            assert r.status_code == 500


@pytest.mark.parametrize("cancel", [False, True])
def test_disconnect_cancels_only_when_asked(client, cancel):
    with client.stream("POST", "/v1/audio/speech", json={
            "model": "test-stream", "input": "x", "response_format": "pcm",
            "stream_format": "audio", "cancel_on_disconnect": cancel}) as resp:
        assert resp.status_code == 200
        job_id = resp.headers["x-job-id"]
        assert next(resp.iter_bytes())
    job = wait_job(client, job_id)
    assert job["status"] == ("cancelled" if cancel else "completed"), job


def test_unstreamable_requests_are_refused(client):
    resp = client.post("/v1/audio/speech", json={"model": "tts-1", "input": "hi",
                                                 "stream_format": "chunks"})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "stream_format"
    resp = client.get("/v1/jobs/job_nope/events", headers={"Last-Event-ID": "x"})
    assert resp.status_code == 400


def test_live_gauge_in_metrics(stack):
    text = httpx.get(stack.metrics_url).text
    assert 'omnijobs_live_active{kind="events"}' in text
    assert 'omnijobs_live_active{kind="wait"}' in text


def test_video_events_carry_the_video_object(client):
    video = client.post("/v1/videos", json={"model": "test-video", "prompt": "A red ball.",
                                            "seconds": 1}).json()
    events = events_of(client, f"/v1/videos/{video['id']}/events")
    final = json.loads(events[-1]["data"])
    assert events[-1]["event"] == "output" and final["object"] == "video"
    assert final["status"] == "completed" and final["outputs"][0]["content_type"] == "video/mp4"
    assert client.get(f"/v1/jobs/{video['id']}/events").status_code == 200
