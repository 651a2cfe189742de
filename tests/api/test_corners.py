"""The corners a new user meets in the first hour: cancelling what has already ended, a
model by id, unknown routes, input with nothing to speak, errors that name the model
the caller used, and request latency by route."""

from __future__ import annotations

import uuid

import pytest
from prometheus_client import REGISTRY, generate_latest

from ..integration.helpers import assert_openai_error

ASYNC = {"Prefer": "respond-async"}


@pytest.fixture(scope="module")
def client(api):
    with api.client("corners-" + uuid.uuid4().hex[:8]) as c:
        yield c


def _job_count(client) -> int:
    return len(client.get("/v1/jobs", params={"limit": 100}).json()["data"])


# ---- cancel --------------------------------------------------------------------------

def test_cancelling_an_ended_job_is_409_naming_its_status(client):
    job_id = client.post("/v1/audio/speech", headers=ASYNC,
                         json={"model": "tts-1", "input": "Stop me."}).json()["id"]
    assert client.post(f"/v1/jobs/{job_id}/cancel").json()["status"] == "cancelled"
    err = assert_openai_error(client.post(f"/v1/jobs/{job_id}/cancel"), 409,
                              "job_not_cancellable")
    assert "cancelled" in err["message"] and job_id in err["message"]
    assert client.get(f"/v1/jobs/{job_id}").json()["status"] == "cancelled"


def test_delete_of_an_ended_video_still_removes_it(client):
    """DELETE cancels a live video first; one that has already ended is simply deleted."""
    video_id = client.post("/v1/videos", json={"prompt": "A lighthouse.", "seconds": 1}
                           ).json()["id"]
    assert client.post(f"/v1/jobs/{video_id}/cancel").status_code == 200
    resp = client.delete(f"/v1/videos/{video_id}")
    assert resp.status_code == 200 and resp.json()["deleted"] is True
    assert_openai_error(client.get(f"/v1/videos/{video_id}"), 404, "not_found")


def test_delete_of_a_speech_job_cancels_it_and_removes_it(client):
    job_id = client.post("/v1/audio/speech", headers=ASYNC,
                         json={"model": "tts-1", "input": "Forget me."}).json()["id"]
    resp = client.delete(f"/v1/jobs/{job_id}")
    assert resp.status_code == 200
    assert resp.json() == {"id": job_id, "object": "job.deleted", "deleted": True}
    assert_openai_error(client.get(f"/v1/jobs/{job_id}"), 404, "not_found")
    assert_openai_error(client.delete(f"/v1/jobs/{job_id}"), 404, "not_found")


def test_replaying_a_delivery_puts_it_back_on_the_schedule(client):
    job_id = client.post("/v1/audio/speech", headers=ASYNC, json={
        "model": "tts-1", "input": "Call back.", "webhook_url": "http://127.0.0.1:9/h"}
    ).json()["id"]
    client.post(f"/v1/jobs/{job_id}/cancel")
    [delivery] = client.get(f"/v1/jobs/{job_id}/webhook_deliveries").json()["data"]
    resp = client.post(f"/v1/webhook_deliveries/{delivery['id']}/replay")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert (body["id"], body["status"], body["event_id"]) == (
        delivery["id"], "pending", delivery["event_id"])
    for bad in ("whd_x", "whd_99999999999", "42", "whd_" + "9" * 30):
        assert_openai_error(client.post(f"/v1/webhook_deliveries/{bad}/replay"), 404,
                            "not_found")


# ---- models and routes ---------------------------------------------------------------

@pytest.mark.parametrize(("model", "pipeline"), [
    ("tts-1", "piper-joe"), ("gpt-4o-mini-tts", "piper-joe"),
    ("piper/en_US-joe-medium", "piper-joe"), ("piper%2Fen_US-joe-medium", "piper-joe"),
    ("sora-2", "reference-t2va")])
def test_a_model_is_retrieved_by_its_id(client, model, pipeline):
    resp = client.get(f"/v1/models/{model}")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["object"] == "model" and body["pipeline"] == pipeline
    assert body["id"] == model.replace("%2F", "/")
    listed = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert listed[body["id"]] == body


def test_an_unknown_model_is_404_in_openai_shape(client, api):
    err = assert_openai_error(client.get("/v1/models/gpt-5-tts"), 404, "model_not_found")
    assert "gpt-5-tts" in err["message"] and err["param"] == "model"
    with api.client() as anonymous:
        assert_openai_error(anonymous.get("/v1/models/tts-1"), 401, "invalid_api_key")


def test_unknown_routes_answer_in_openai_shape(client):
    err = assert_openai_error(client.get("/v1/nothing-here"), 404, "not_found")
    assert "/v1/nothing-here" in err["message"]
    assert_openai_error(client.delete("/v1/models"), 405, "method_not_allowed")


def test_a_405_names_every_allowed_method_and_the_whole_path(client):
    """GET and DELETE of /v1/jobs/{id} are two routes; the answer names both."""
    path = "/v1/jobs/job_" + "0123456789abcdef" * 2
    resp = client.put(path)
    err = assert_openai_error(resp, 405, "method_not_allowed")
    assert resp.headers["allow"] == "DELETE, GET"
    assert err["message"] == f"method not allowed: PUT {path}; this path allows DELETE, GET"
    listing = client.delete("/v1/models")
    assert listing.headers["allow"] == "GET" and "allows GET" in listing.json()["error"][
        "message"]


# ---- input that cannot be spoken -----------------------------------------------------

@pytest.mark.parametrize("text", [" ", ".", "...", "?!", "( )", "\n\t", "\u200b", "--"])
def test_speech_input_with_nothing_to_speak_is_400_and_stores_nothing(client, text):
    before = _job_count(client)
    resp = client.post("/v1/audio/speech", json={"model": "tts-1", "input": text})
    err = assert_openai_error(resp, 400, "empty_input")
    assert err["param"] == "input"
    assert _job_count(client) == before


@pytest.mark.parametrize("text", ["$", "7", "a.", "中"])
def test_speech_input_with_a_letter_digit_or_symbol_is_accepted(client, text):
    resp = client.post("/v1/audio/speech", headers=ASYNC, json={"model": "tts-1", "input": text})
    assert resp.status_code == 202, resp.text


def test_video_prompt_with_nothing_to_render_is_400(client):
    before = _job_count(client)
    err = assert_openai_error(client.post("/v1/videos", json={"prompt": " . "}), 400,
                              "empty_input")
    assert err["param"] == "prompt"
    assert _job_count(client) == before


# ---- errors name the model the caller used -------------------------------------------

def test_an_alias_refusal_names_the_alias_and_what_serves_it(client):
    resp = client.post("/v1/audio/speech", json={"model": "gpt-4o-mini-tts", "input": "Hi.",
                                                 "instructions": "Whisper."})
    err = assert_openai_error(resp, 400, "unsupported_parameter")
    assert "'gpt-4o-mini-tts'" in err["message"] and "piper-joe" in err["message"]
    assert "piper/en_US-joe-medium" not in err["message"]
    assert "instructions" in err["message"]


# ---- metrics -------------------------------------------------------------------------

def _latency_count(route: str, status: str, method: str = "GET") -> float:
    return REGISTRY.get_sample_value("omnijobs_http_request_duration_seconds_count",
                                     {"method": method, "route": route, "status": status}
                                     ) or 0.0


def test_request_latency_is_labelled_by_route_template_never_the_raw_path(client):
    job_id = "job_" + uuid.uuid4().hex
    before = _latency_count("/v1/jobs/{job_id}", "404")
    assert client.get(f"/v1/jobs/{job_id}").status_code == 404
    assert _latency_count("/v1/jobs/{job_id}", "404") == before + 1
    unmatched = _latency_count("unmatched", "404")
    assert client.get(f"/v1/nothing/{job_id}").status_code == 404
    assert _latency_count("unmatched", "404") == unmatched + 1
    assert job_id not in generate_latest().decode()


def test_an_unknown_method_is_one_label_value(client):
    before = _latency_count("unmatched", "404", method="other")
    client.request("BREW", "/v1/nothing")
    client.request("PROPFIND", "/v1/nothing")
    assert _latency_count("unmatched", "404", method="other") == before + 2


def test_a_model_id_with_a_line_break_is_still_the_models_route(api, client):
    """Without a key it is a 401 like every guarded route, not an unmatched path's 404."""
    with api.client() as anon:
        assert anon.get("/v1/models/a%0Ab").status_code == 401
    resp = client.get("/v1/models/a%0Ab")
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "model_not_found"


def test_signed_local_urls_answer_head_and_byte_ranges(api):
    """A browser's <video> seeks with GET and Range, which S3's presigned URLs answer
    too; the local store also answers HEAD, which they do not (they are signed for GET:
    tests/integration/test_video_e2e.py pins both)."""
    store = api.services.store
    data = bytes(range(256)) * 8
    key = f"ten_corners/job_{uuid.uuid4().hex}/0.mp4"
    store.put(key, data, "video/mp4")
    url, _ = store.signed_url(key, 60)
    path = url.removeprefix(store.base_url)
    with api.client() as anon:  # signed URLs need no key
        head = anon.head(path)
        assert head.status_code == 200 and head.content == b""
        assert head.headers["content-length"] == str(len(data))
        assert head.headers["accept-ranges"] == "bytes"
        assert head.headers["content-type"] == "video/mp4"
        part = anon.get(path, headers={"Range": "bytes=100-109"})
        assert part.status_code == 206 and part.content == data[100:110]
        assert part.headers["content-range"] == f"bytes 100-109/{len(data)}"
        first = anon.get(path, headers={"Range": "bytes=0-0"})  # the size, as on S3
        assert first.headers["content-range"] == f"bytes 0-0/{len(data)}"
        assert anon.get(path).content == data
        assert anon.head(path.replace("signature=", "signature=0")).status_code == 403


def test_deleting_local_objects_leaves_no_empty_folders(api):
    store = api.services.store
    job = f"ten_corners/job_{uuid.uuid4().hex}"
    keys = [f"{job}/0.wav", f"{job}/1.wav"]
    for key in keys:
        store.put(key, b"RIFF", "audio/wav")
    store.delete(keys)
    assert not (store.root / job).exists()
    assert store.root.exists()
