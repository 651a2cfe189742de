"""NUL, other control characters and lone surrogates in any stored text are a 400 naming
the field, at the schema: never a database error (500), never a stored row."""

from __future__ import annotations

import json
import uuid

import pytest

from ..integration.helpers import assert_openai_error

SPEECH = {"model": "tts-1", "input": "Hello there."}
VIDEO = {"prompt": "A lighthouse.", "seconds": 1}
ENDPOINT = {"name": "hook", "url": "http://127.0.0.1:9/hook",
            "event_types": ["speech.completed"]}
PUBLIC_IP_URL = "http://93.184.216.34/a"  # a literal public address: no DNS lookup


@pytest.fixture(scope="module")
def client(api):
    with api.client("ctl-" + uuid.uuid4().hex[:8]) as c:
        yield c


def refused(resp, param: str, says: str = "control character") -> None:
    err = assert_openai_error(resp, 400)
    assert err["param"] == param, err
    assert says in err["message"], err


@pytest.mark.parametrize("bad", ["\x00", "\x01", "\x1b", "\x7f", "\x85"])
@pytest.mark.parametrize(("field", "make"), [
    ("webhook_url", lambda c: {**SPEECH, "webhook_url": PUBLIC_IP_URL + c}),
    ("input", lambda c: {**SPEECH, "input": "Hello" + c}),
    ("instructions", lambda c: {**SPEECH, "instructions": "calm" + c}),
    ("voice", lambda c: {**SPEECH, "voice": "joe" + c}),
    ("model", lambda c: {**SPEECH, "model": "tts-1" + c}),
    ("metadata", lambda c: {**SPEECH, "metadata": {"k" + c: "v"}}),
    ("metadata", lambda c: {**SPEECH, "metadata": {"k": "v" + c}}),
])
def test_speech_fields(client, field, make, bad):
    resp = client.post("/v1/audio/speech", json=make(bad),
                       headers={"Prefer": "respond-async"})
    refused(resp, field)


@pytest.mark.parametrize(("field", "body"), [
    ("prompt", {**VIDEO, "prompt": "A light\x00house."}),
    ("negative_prompt", {**VIDEO, "negative_prompt": "blur\x00"}),
    ("webhook_url", {**VIDEO, "webhook_url": PUBLIC_IP_URL + "\x00"}),
    ("metadata", {**VIDEO, "metadata": {"k": "\x00"}}),
])
def test_video_fields(client, field, body):
    refused(client.post("/v1/videos", json=body), field)


def test_video_form_fields(client):
    resp = client.post("/v1/videos", data={"prompt": "A light\x00house.",
                                           "metadata": json.dumps({"k": "v"})})
    refused(resp, "prompt")
    resp = client.post("/v1/videos", data={"prompt": "A lighthouse.",
                                           "metadata": json.dumps({"k\x00": "v"})})
    refused(resp, "metadata")


def test_line_breaks_and_tabs_in_prose_are_kept(client):
    resp = client.post("/v1/audio/speech", headers={"Prefer": "respond-async"},
                       json={**SPEECH, "input": "One line.\nAnother,\tthen\r\nthe end.",
                             "metadata": {"note": "two\nlines"}})
    assert resp.status_code == 202, resp.text
    job = client.get(f"/v1/jobs/{resp.json()['id']}").json()
    assert job["metadata"] == {"note": "two\nlines"}


@pytest.mark.parametrize("text", ["\\ud800", "\\udfff"])
def test_lone_surrogates_are_refused_and_never_echoed_raw(client, text):
    """JSON may spell a lone surrogate (``\\ud800``) that UTF-8 cannot encode: it must be
    refused, and the error that quotes it must still be writable."""
    raw = '{"model":"tts-1","input":"Hi","metadata":{"k":"TEXT"}}'.replace("TEXT", text)
    resp = client.post("/v1/audio/speech", content=raw.encode(),
                       headers={"content-type": "application/json",
                                "Prefer": "respond-async"})
    refused(resp, "metadata", "lone surrogate")
    raw = '{"model":"tts-1","input":"Hi TEXT"}'.replace("TEXT", text)
    resp = client.post("/v1/audio/speech", content=raw.encode(),
                       headers={"content-type": "application/json",
                                "Prefer": "respond-async"})
    refused(resp, "input", "unicode")  # pydantic's own refusal of a str field


def test_an_unknown_extra_field_with_nul_is_400(client):
    resp = client.post("/v1/audio/speech", headers={"Prefer": "respond-async"},
                       json={**SPEECH, "style\x00": "x"})
    assert assert_openai_error(resp, 400)["param"] is not None


@pytest.mark.parametrize("field", ["name", "url"])
def test_webhook_endpoint_create_and_update(client, field):
    bad = {"name": "a\x00b", "url": "http://127.0.0.1:9/h\x00"}[field]
    refused(client.post("/v1/webhook_endpoints", json={**ENDPOINT, field: bad}), field)
    created = client.post("/v1/webhook_endpoints", json=ENDPOINT)
    assert created.status_code == 200, created.text
    endpoint_id = created.json()["id"]
    refused(client.post(f"/v1/webhook_endpoints/{endpoint_id}", json={field: bad}), field)
    assert client.get(f"/v1/webhook_endpoints/{endpoint_id}").json()[field] == ENDPOINT[field]


def test_batch_metadata(client):
    resp = client.post("/v1/batches", json={
        "input_file_id": "file-" + "0" * 32, "endpoint": "/v1/audio/speech",
        "completion_window": "24h", "metadata": {"k": "\x00"}})
    refused(resp, "metadata")


def test_file_names(client):
    # written by hand: an HTTP client would percent-encode the name
    body = (b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            b'--b\r\nContent-Disposition: form-data; name="file"; filename="in\x01put.jsonl"'
            b'\r\nContent-Type: application/jsonl\r\n\r\n{}\n\r\n--b--\r\n')
    resp = client.post("/v1/files", content=body,
                       headers={"content-type": "multipart/form-data; boundary=b"})
    refused(resp, "file")
    assert client.get("/v1/files").json()["data"] == []


def test_list_filters(client):
    refused(client.get("/v1/files", params={"purpose": "batch\x00"}), "purpose")


def test_idempotency_keys(client):
    resp = client.post("/v1/audio/speech", json=SPEECH,
                       headers={"Prefer": "respond-async", "Idempotency-Key": "k\x7f"})
    refused(resp, "Idempotency-Key")

