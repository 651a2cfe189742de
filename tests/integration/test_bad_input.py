"""Bad input gets a clear 400 in OpenAI's error shape and nothing is queued."""

from __future__ import annotations

import pytest

from .helpers import assert_openai_error

LONG = "x" * 200

CASES = [
    ({"model": "tts-1", "input": ""}, "input"),
    ({"model": "tts-1", "input": "a" * 4097}, "input"),
    ({"model": "tts-1"}, "input"),
    ({"input": "hi"}, "model"),
    ({"model": "tts-1", "input": "hi", "response_format": "wma" + LONG}, "response_format"),
    ({"model": "tts-1", "input": "hi", "speed": 4.5}, "speed"),
    ({"model": "tts-1", "input": "hi", "speed": 0.1}, "speed"),
    ({"model": "no-such-model" + LONG, "input": "hi"}, "model"),
    ({"model": "tts-1", "input": "hi", "voice": "darth" + LONG}, "voice"),
    ({"model": "tts-1", "input": "hi", "instructions": "whisper"}, "instructions"),
    ({"model": "tts-1", "input": "hi", "ref_audio": "data:..."}, "ref_audio"),
    ({"model": "tts-1", "input": "hi", "stream_format": "chunks"}, "stream_format"),
    ({"model": "tts-1", "input": "hi", "metadata": {f"k{i}": "v" for i in range(17)}},
     "metadata"),
    ({"model": "tts-1", "input": ["not", "a", "string"]}, "input"),
]


@pytest.fixture(scope="module")
def client(stack):
    with stack.client(stack.new_key("careless")) as c:
        yield c


@pytest.mark.parametrize(("body", "param"), CASES, ids=[p for _, p in CASES])
def test_bad_speech_request_is_400_and_queues_nothing(client, body, param):
    resp = client.post("/v1/audio/speech", json=body)
    err = assert_openai_error(resp, 400)
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param
    assert LONG not in err["message"]  # echoes are cut to 32 characters
    assert client.get("/v1/jobs").json()["data"] == []


def test_invalid_json_is_400(client):
    resp = client.post("/v1/audio/speech", content=b"{not json",
                       headers={"Content-Type": "application/json"})
    assert_openai_error(resp, 400)


def test_missing_and_wrong_key_are_401(stack):
    with stack.client(None) as anon:
        assert_openai_error(anon.get("/v1/jobs"), 401, "invalid_api_key")
    with stack.client("oj-not-a-real-key") as wrong:
        assert_openai_error(wrong.post("/v1/audio/speech", json={"model": "tts-1",
                                                                 "input": "hi"}),
                            401, "invalid_api_key")


def test_unknown_job_and_route_are_404(client):
    assert_openai_error(client.get("/v1/jobs/job_" + "0" * 32), 404, "not_found")
    assert_openai_error(client.get("/v1/nothing-here"), 404)


def test_bad_list_parameters_are_400(client):
    assert_openai_error(client.get("/v1/jobs", params={"limit": 0}), 400)
    assert_openai_error(client.get("/v1/jobs", params={"order": "sideways"}), 400)
    assert_openai_error(client.get("/v1/jobs", params={"status": "done"}), 400)


def test_idempotency_key_reused_for_another_request_is_409(stack):
    client = stack.client(stack.new_key("idempotent"))
    headers = {"Prefer": "respond-async", "Idempotency-Key": "reuse-me"}
    first = client.post("/v1/audio/speech", headers=headers,
                        json={"model": "tts-1", "input": "First."})
    assert first.status_code == 202
    assert_openai_error(client.post("/v1/audio/speech", headers=headers,
                                    json={"model": "tts-1", "input": "Second."}),
                        409, "idempotency_key_reused")
    assert_openai_error(client.post("/v1/videos", headers=headers,
                                    json={"prompt": "A video now."}),
                        409, "idempotency_key_reused")


def test_deeply_nested_json_is_400_not_500(client):
    body = b"[" * 100_000 + b"]" * 100_000
    for path in ("/v1/audio/speech", "/v1/videos"):
        resp = client.post(path, content=body, headers={"Content-Type": "application/json"})
        assert_openai_error(resp, 400)


def test_video_raw_size_budget_is_400(client):
    resp = client.post("/v1/videos", json={"prompt": "Huge.", "size": "1280x1280",
                                           "seconds": 20, "fps": 60, "n": 4})
    assert assert_openai_error(resp, 400)["param"] == "size"
