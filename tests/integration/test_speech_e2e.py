"""Speech jobs end to end: real API and worker processes over PostgreSQL, Redis and
SeaweedFS, with the real Piper pipeline."""

from __future__ import annotations

import hashlib

import httpx
import pytest
from openai import OpenAI

from media.validate import rms

from .helpers import assert_openai_error, decode, wait_job

TEXT = "Omnijobs turns text into speech. Every job is durable."


@pytest.fixture(scope="module")
def key(stack) -> str:
    return stack.new_key("acme")


@pytest.fixture(scope="module")
def client(stack, key):
    with stack.client(key) as c:
        yield c


def test_submit_poll_download_without_auth(client):
    resp = client.post("/v1/audio/speech", headers={"Prefer": "respond-async"},
                       json={"model": "tts-1", "input": TEXT, "voice": "alloy",
                             "response_format": "wav", "metadata": {"ticket": "T-1"}})
    assert resp.status_code == 202, resp.text
    assert resp.headers["location"] == f"/v1/jobs/{resp.json()['id']}"
    job = wait_job(client, resp.json()["id"])
    assert job["status"] == "completed", job
    assert job["progress"] == 100 and job["attempts"] == 1 and job["error"] is None
    assert job["metadata"] == {"ticket": "T-1"}
    [out] = job["outputs"]
    assert out["content_type"] == "audio/wav" and out["sample_rate"] == 22050
    assert out["channels"] == 1 and 2.0 < out["duration_s"] < 10.0
    data = httpx.get(out["url"], timeout=30).content  # no Authorization header
    assert len(data) == out["bytes"]
    assert hashlib.sha256(data).hexdigest() == out["sha256"]
    probe = decode(data, "wav")
    assert probe.sample_rate == 22050
    assert abs(probe.duration_s - out["duration_s"]) < 0.01
    assert rms(probe.samples) > 0.01
    content = client.get(f"/v1/jobs/{job['id']}/content")
    assert content.status_code == 200 and content.content == data


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac", "wav", "pcm"])
def test_openai_sdk_every_format(stack, key, fmt):
    sdk = OpenAI(base_url=f"{stack.base_url}/v1", api_key=key, max_retries=0)
    resp = sdk.audio.speech.create(model="tts-1", voice="alloy", input=TEXT,
                                   response_format=fmt)
    data = resp.read()
    probe = decode(data, fmt)
    expected_rate = {"opus": 48000, "pcm": 24000}.get(fmt, 22050)
    assert probe.sample_rate == expected_rate
    assert 2.0 < probe.duration_s < 10.0
    assert rms(probe.samples) > 0.01
    job_id = resp.response.headers["x-job-id"]
    job = sdk.get(f"/jobs/{job_id}", cast_to=object)
    assert job["outputs"][0]["sample_rate"] == expected_rate
    assert abs(job["outputs"][0]["duration_s"] - probe.duration_s) < 0.01


def test_openai_sdk_retrieves_models_by_id(stack, key):
    """``client.models.retrieve``, an id with a slash included; an unknown id is the SDK's
    NotFoundError, and an unknown route is an error in OpenAI's shape too."""
    import openai

    sdk = OpenAI(base_url=f"{stack.base_url}/v1", api_key=key, max_retries=0)
    for model_id, pipeline in [("tts-1", "piper-joe"), ("piper/en_US-joe-medium", "piper-joe"),
                               ("MiniMaxAI/MiniMax-H3", "minimax-h3")]:
        model = sdk.models.retrieve(model_id)
        assert model.id == model_id and model.object == "model"
        assert model.model_extra["pipeline"] == pipeline
    with pytest.raises(openai.NotFoundError) as err:
        sdk.models.retrieve("gpt-5-tts")
    assert err.value.code == "model_not_found" and "gpt-5-tts" in err.value.message
    with pytest.raises(openai.NotFoundError) as err:
        sdk.get("/nothing-here", cast_to=object)
    assert err.value.code == "not_found"


def test_signed_url_expires(stack, key):
    """The stack signs URLs for a few seconds only (OMNIJOBS_SIGNED_URL_TTL_S)."""
    import time

    with stack.client(key) as c:
        resp = c.post("/v1/audio/speech", json={"model": "tts-1", "input": "Short lived.",
                                                "response_format": "mp3"})
        assert resp.status_code == 200
        url = c.get(f"/v1/jobs/{resp.headers['x-job-id']}").json()["outputs"][0]["url"]
    assert httpx.get(url).status_code == 200
    tampered = url.replace("Signature=", "Signature=0")
    assert httpx.get(tampered).status_code == 403
    time.sleep(int(stack.env["OMNIJOBS_SIGNED_URL_TTL_S"]) + 1.5)
    assert httpx.get(url).status_code == 403


def test_other_tenant_gets_404(stack, client):
    job = client.post("/v1/audio/speech", headers={"Prefer": "respond-async"},
                      json={"model": "tts-1", "input": "Private words."}).json()
    with stack.client(stack.new_key("intruder")) as other:
        for method, path in [("GET", f"/v1/jobs/{job['id']}"),
                             ("GET", f"/v1/jobs/{job['id']}/content"),
                             ("POST", f"/v1/jobs/{job['id']}/cancel")]:
            assert_openai_error(other.request(method, path), 404, "not_found")
        assert all(j["id"] != job["id"] for j in other.get("/v1/jobs").json()["data"])


def test_silent_result_fails_with_reason(client):
    resp = client.post("/v1/audio/speech", headers={"Prefer": "respond-async"},
                       json={"model": "test-silent", "input": "Nothing to hear."})
    job = wait_job(client, resp.json()["id"])
    assert job["status"] == "failed"
    assert job["error"]["code"] == "silent_audio"
    assert "silent" in job["error"]["message"]
    assert job["outputs"] == []
    sync = client.post("/v1/audio/speech", json={"model": "test-silent", "input": "Again."})
    err = assert_openai_error(sync, 500, "silent_audio")
    assert sync.headers["x-should-retry"] == "false"
    assert "failed" in err["message"]


def test_wait_bound_answers_202(client):
    """A 3 s job with ``Prefer: wait=1`` answers 202 while it still runs; ignoring the
    header would wait (up to 30 s here) for it to complete and answer 200 with audio."""
    resp = client.post("/v1/audio/speech", headers={"Prefer": "wait=1"},
                       json={"model": "test-sleep", "input": "3"})
    assert resp.status_code == 202, resp.text
    assert resp.headers["preference-applied"] == "wait=1"
    job = resp.json()
    assert job["status"] in ("queued", "running")
    assert client.get(f"/v1/jobs/{job['id']}").json()["status"] != "completed"
    assert wait_job(client, job["id"])["status"] == "completed"


def test_list_paginates_and_filters(stack):
    with stack.client(stack.new_key("lister")) as c:
        ids = [c.post("/v1/audio/speech", headers={"Prefer": "respond-async"},
                      json={"model": "tts-1", "input": f"Item {i}."}).json()["id"]
               for i in range(3)]
        for job_id in ids:
            wait_job(c, job_id)
        page1 = c.get("/v1/jobs", params={"limit": 2, "order": "asc"}).json()
        assert [j["id"] for j in page1["data"]] == ids[:2] and page1["has_more"]
        page2 = c.get("/v1/jobs", params={"limit": 2, "order": "asc",
                                          "after": page1["last_id"]}).json()
        assert [j["id"] for j in page2["data"]] == ids[2:] and not page2["has_more"]
        desc = c.get("/v1/jobs").json()
        assert [j["id"] for j in desc["data"]] == ids[::-1]
        assert c.get("/v1/jobs", params={"status": "failed"}).json()["data"] == []
        assert len(c.get("/v1/jobs", params={"kind": "speech"}).json()["data"]) == 3


def test_idempotency_key_returns_same_job(client):
    body = {"model": "tts-1", "input": "Exactly once."}
    headers = {"Prefer": "respond-async", "Idempotency-Key": "order-42"}
    first = client.post("/v1/audio/speech", headers=headers, json=body).json()
    second = client.post("/v1/audio/speech", headers=headers, json=body).json()
    assert first["id"] == second["id"]


def test_models_lists_pipelines(client):
    data = client.get("/v1/models").json()["data"]
    by_id = {m["id"]: m for m in data}
    assert by_id["tts-1"]["pipeline"] == "piper-joe"
    assert by_id["piper/en_US-joe-medium"]["sample_rate"] == 22050
    assert by_id["tts-1"]["max_input_chars"] == 4096


def test_models_lists_video_limits(client):
    by_id = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    video = by_id["sora-2"]
    assert video["pipeline"] == "reference-t2va" and video["kind"] == "video"
    assert video["video"]["default_size"] == "448x256" and video["video"]["max_n"] == 4
    assert by_id["tts-1"]["video"] is None


def test_worker_logs_are_json_with_job_id(stack, client):
    import json

    resp = client.post("/v1/audio/speech", json={"model": "tts-1", "input": "Log me."})
    job_id = resp.headers["x-job-id"]
    lines = stack.processes["worker"].log.read_text().splitlines()
    records = [json.loads(line) for line in lines if line.startswith("{")]
    mine = [r for r in records if r.get("job_id") == job_id]
    assert any("completed" in r["message"] for r in mine), mine
    assert all({"time", "level", "name"} <= set(r) for r in mine)


def test_metrics_count_submissions(stack, client):
    def submitted() -> float:
        text = httpx.get(stack.metrics_url).text
        prefix = 'omnijobs_jobs_submitted_total{kind="speech",model="tts-1"}'
        return next((float(x.split()[-1]) for x in text.splitlines() if x.startswith(prefix)),
                    0.0)

    before = submitted()
    client.post("/v1/audio/speech", headers={"Prefer": "respond-async"},
                json={"model": "tts-1", "input": "Count me."})
    assert httpx.get(f"{stack.base_url}/metrics").status_code == 404  # not on the public port
    assert submitted() == before + 1
    # An idempotent replay is not a new submission.
    headers = {"Prefer": "respond-async", "Idempotency-Key": "count-" + str(before)}
    for _ in range(2):
        client.post("/v1/audio/speech", headers=headers,
                    json={"model": "tts-1", "input": "Count me once."})
    assert submitted() == before + 2


def test_delete_of_a_completed_speech_job_removes_its_outputs_and_record(stack, client,
                                                                       seaweedfs):
    """As DELETE /v1/videos/{id} does for a video: the objects in the store, then the
    record; the signed URL handed out before answers 404 after."""
    resp = client.post("/v1/audio/speech", json={"model": "tts-1", "input": TEXT,
                                                 "voice": "alloy", "response_format": "wav"})
    assert resp.status_code == 200, resp.text
    job = wait_job(client, resp.headers["x-job-id"])
    [out] = job["outputs"]
    assert httpx.get(out["url"], timeout=30).status_code == 200
    s3, bucket = seaweedfs.client(), stack.env["OMNIJOBS_S3_BUCKET"]

    def stored() -> list[str]:  # keys are tenant/job/attempt/...
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket)
        return [o["Key"] for page in pages for o in page.get("Contents", [])
                if f"/{job['id']}/" in o["Key"]]

    assert stored()
    deleted = client.delete(f"/v1/jobs/{job['id']}")
    assert deleted.status_code == 200, deleted.text
    assert deleted.json() == {"id": job["id"], "object": "job.deleted", "deleted": True}
    assert stored() == []
    assert httpx.get(out["url"], timeout=30).status_code == 404
    assert_openai_error(client.get(f"/v1/jobs/{job['id']}"), 404)
    assert_openai_error(client.get(f"/v1/jobs/{job['id']}/content"), 404)
    assert_openai_error(client.delete(f"/v1/jobs/{job['id']}"), 404)
