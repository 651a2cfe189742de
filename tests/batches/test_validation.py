"""Validation: a bad body costs only its own line (with the endpoint's own 400), a render
failure is an error line with its reason, and an unusable file fails the whole batch with
every error and its line number, creating nothing."""

from __future__ import annotations

import io

import pytest

from .conftest import batch_jobs, jsonl, results, speech_line, video_line, wait_batch

BAD_SPEECH = {
    "too-fast": {"model": "tts-1", "input": "x", "speed": 9},
    "no-such-model": {"model": "no-such-model", "input": "x"},
    "unknown-voice": {"model": "tts-1", "input": "x", "voice": "nobody"},
    "no-input": {"model": "tts-1"},
    "video-model": {"model": "sora-2", "input": "x"},
}
BAD_VIDEO = {
    "odd-size": {"model": "test-video", "prompt": "ok", "size": "63x47"},
    "fractional-fps": {"model": "test-video", "prompt": "ok", "fps": 23.976},
    "too-many": {"model": "test-video", "prompt": "ok", "n": 9},
    "unknown-field": {"model": "test-video", "prompt": "ok", "loop": True},
}


def run_batch(sdk, endpoint: str, lines: list[dict]):
    source = sdk.files.create(file=("in.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    batch = sdk.batches.create(input_file_id=source.id, endpoint=endpoint,
                               completion_window="24h")
    return wait_batch(sdk, batch.id)


def endpoint_answer(client, endpoint: str, body: dict) -> tuple[int, dict]:
    resp = client.post(endpoint, json=body, headers={"Prefer": "respond-async"})
    return resp.status_code, resp.json()


def test_bad_speech_bodies_fail_alone_with_the_endpoints_answer(sdk, client, db):
    lines = [speech_line("good-1", input="First good line."),
             *({"custom_id": name, "method": "POST", "url": "/v1/audio/speech", "body": body}
               for name, body in BAD_SPEECH.items()),
             speech_line("silent", model="test-silent", input="renders silence"),
             speech_line("hook", input="x", webhook_url="http://127.0.0.1:9/hook"),
             speech_line("good-2", input="Second good line.")]
    done = run_batch(sdk, "/v1/audio/speech", lines)
    assert done.status == "completed", done
    counts = done.request_counts
    assert (counts.total, counts.completed, counts.failed) == (len(lines), 2, len(BAD_SPEECH) + 2)
    assert [x["custom_id"] for x in results(sdk, done.output_file_id)] == ["good-1", "good-2"]
    errors = {x["custom_id"]: x for x in results(sdk, done.error_file_id)}
    assert list(errors) == [*BAD_SPEECH, "silent", "hook"]  # input order
    for name, body in BAD_SPEECH.items():
        status, answer = endpoint_answer(client, "/v1/audio/speech", body)
        assert status == 400
        assert errors[name]["response"] == {"status_code": 400, "request_id": None,
                                            "body": answer}, name
        assert errors[name]["error"] is None
    silent = errors["silent"]
    assert silent["error"]["code"] == "silent_audio"
    assert silent["response"]["body"]["status"] == "failed"
    assert silent["response"]["body"]["error"]["code"] == "silent_audio"
    hook = errors["hook"]["response"]["body"]["error"]  # a batch reports by its own events
    assert (hook["code"], hook["param"]) == ("unsupported_parameter", "webhook_url")
    assert batch_jobs(db, done.id) == {"completed": 2, "failed": 1}  # refused lines: no job


def test_bad_video_bodies_fail_alone_with_the_endpoints_answer(sdk, client):
    lines = [video_line("fine"), *({"custom_id": name, "method": "POST", "url": "/v1/videos",
                                    "body": body} for name, body in BAD_VIDEO.items())]
    done = run_batch(sdk, "/v1/videos", lines)
    assert done.status == "completed", done
    assert (done.request_counts.completed, done.request_counts.failed) == (1, len(BAD_VIDEO))
    errors = {x["custom_id"]: x for x in results(sdk, done.error_file_id)}
    for name, body in BAD_VIDEO.items():
        status, answer = endpoint_answer(client, "/v1/videos", body)
        assert (status, errors[name]["response"]["body"]) == (400, answer), name


def test_an_unusable_file_fails_the_batch_and_creates_nothing(sdk, db):
    good = speech_line("a", input="fine")
    raw = b"\n".join([
        jsonl([good]).strip(),
        b"{not json",
        jsonl([{"custom_id": "b", "method": "POST", "body": {}}]).strip(),
        jsonl([{**speech_line("c", input="x"), "url": "/v1/videos"}]).strip(),
        jsonl([speech_line("a", input="again")]).strip(),
        b"",
        jsonl([{**speech_line("d", input="x"), "method": "GET"}]).strip(),
        b"[1, 2]",
    ]) + b"\n"
    source = sdk.files.create(file=("broken.jsonl", io.BytesIO(raw)), purpose="batch")
    batch = sdk.batches.create(input_file_id=source.id, endpoint="/v1/audio/speech",
                               completion_window="24h")
    done = wait_batch(sdk, batch.id)
    assert done.status == "failed" and done.failed_at and done.in_progress_at is None
    found = [(e.code, e.line) for e in done.errors.data]
    assert found == [("invalid_json_line", 2), ("missing_required_parameter", 3),
                     ("invalid_url", 4), ("duplicate_custom_id", 5), ("invalid_method", 7),
                     ("invalid_json_line", 8)]
    assert done.errors.data[1].param == "url" and "url" in done.errors.data[1].message
    assert done.output_file_id is None and done.error_file_id is None
    assert batch_jobs(db, done.id) == {}


def test_an_empty_file_and_a_missing_file_fail_the_batch(sdk):
    empty = sdk.files.create(file=("empty.jsonl", io.BytesIO(b"\n\n")), purpose="batch")
    batch = sdk.batches.create(input_file_id=empty.id, endpoint="/v1/audio/speech",
                               completion_window="24h")
    assert [e.code for e in wait_batch(sdk, batch.id).errors.data] == ["empty_file"]
    gone = sdk.files.create(file=("gone.jsonl", io.BytesIO(jsonl([speech_line("a", input="x")]))),
                            purpose="batch")
    batch = sdk.batches.create(input_file_id=gone.id, endpoint="/v1/audio/speech",
                               completion_window="24h")
    sdk.files.delete(gone.id)
    done = wait_batch(sdk, batch.id)
    assert done.status == "failed"
    assert [e.code for e in done.errors.data] == ["input_file_not_found"]


def test_batch_create_is_checked(sdk, client):
    source = sdk.files.create(file=("a.jsonl", io.BytesIO(jsonl([speech_line("a", input="x")]))),
                              purpose="batch")
    cases = [({"endpoint": "/v1/chat/completions"}, "endpoint"),
             ({"completion_window": "1h"}, "completion_window"),
             ({"input_file_id": "file-nope"}, "input_file_id"),
             ({"metadata": {"k": "v" * 600}}, "metadata"),
             ({"output_expires_after": {"anchor": "created_at", "seconds": 60}},
              "output_expires_after.seconds")]
    for change, param in cases:
        body = {"input_file_id": source.id, "endpoint": "/v1/audio/speech",
                "completion_window": "24h", **change}
        resp = client.post("/v1/batches", json=body)
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["param"] == param, resp.text
    assert client.get("/v1/batches/batch_nope").status_code == 404


def test_the_bulk_quota_is_a_429_of_its_own(batch_stack, sdk):
    """Ten unfinished batches per tenant (test-slow is never rendered here)."""
    from openai import OpenAI, RateLimitError

    tenant = OpenAI(base_url=sdk.base_url, api_key=batch_stack.new_key("quota"), max_retries=0)
    source = tenant.files.create(file=("a.jsonl", io.BytesIO(jsonl([speech_line(
        "a", model="test-slow", input="x")]))), purpose="batch")
    made = [tenant.batches.create(input_file_id=source.id, endpoint="/v1/audio/speech",
                                  completion_window="24h") for _ in range(10)]
    with pytest.raises(RateLimitError) as exc:
        tenant.batches.create(input_file_id=source.id, endpoint="/v1/audio/speech",
                              completion_window="24h")
    assert exc.value.body["code"] == "batch_quota_exceeded"
    speech = tenant.audio.speech.with_raw_response.create(  # interactive work goes on
        model="tts-1", voice="alloy", input="Still here.", response_format="wav")
    assert speech.status_code == 200
    for batch in made:
        tenant.batches.cancel(batch.id)
    wait_batch(tenant, made[-1].id)
    tenant.batches.create(input_file_id=source.id, endpoint="/v1/audio/speech",
                          completion_window="24h")
