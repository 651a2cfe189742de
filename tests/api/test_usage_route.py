"""``GET /v1/usage`` in-process: OpenAI's page of buckets (every bucket listed, empty
ones too, paged by ``next_page``), a tenant's own jobs only, and 400s naming the
parameter; the OpenAPI schema documents usage, deadlines and the route."""

from __future__ import annotations

import uuid

import pytest

from storage.records import OutputRecord

from .conftest import new_key

HOUR = 3600


def finished(api, key: str, render_s: float) -> str:
    resp = api.client(key=key).post("/v1/audio/speech", headers={"Prefer": "respond-async"},
                                    json={"model": "tts-1", "input": "Metered."})
    job_id = resp.json()["id"]
    jobs = api.services.jobs
    attempt = jobs.claim(job_id, "w", lease_s=60).attempts
    assert jobs.complete(job_id, attempt, [OutputRecord(
        index=0, key=f"k/{job_id}", content_type="audio/mpeg", bytes=100, sha256="0" * 64,
        duration_s=1.0, sample_rate=24000, channels=1)], 3600, render=(render_s, "cpu"))
    return job_id


def test_buckets_pages_and_tenants(api):
    key = new_key(api.db_url, "usage-" + uuid.uuid4().hex[:8])
    other = new_key(api.db_url, "usage-" + uuid.uuid4().hex[:8])
    job_ids = [finished(api, key, 0.25), finished(api, key, 0.5)]
    finished(api, other, 9.0)
    job = api.client(key=key).get(f"/v1/jobs/{job_ids[0]}").json()
    assert job["usage"]["render_seconds"] == 0.25 and job["usage"]["device"] == "cpu"
    now = int(api.services.jobs.get(job_ids[1]).completed_at.timestamp())
    start = now // HOUR * HOUR - 2 * HOUR
    client = api.client(key=key)
    page = client.get("/v1/usage", params={"start_time": start, "bucket_width": "1h",
                                           "limit": 2, "end_time": start + 3 * HOUR}).json()
    assert [b["results"] for b in page["data"]] == [[], []]  # empty buckets listed too
    assert page["has_more"] and page["next_page"] == str(start + 2 * HOUR)
    last = client.get("/v1/usage", params={
        "start_time": start, "bucket_width": "1h", "limit": 2, "end_time": start + 3 * HOUR,
        "page": page["next_page"], "group_by[]": "model"}).json()
    [bucket] = last["data"]
    assert (bucket["start_time"], bucket["end_time"]) == (start + 2 * HOUR, start + 3 * HOUR)
    [result] = bucket["results"]
    assert (result["model"], result["num_jobs"], result["render_seconds"]) == ("tts-1", 2, 0.75)
    assert not last["has_more"] and last["next_page"] is None


@pytest.mark.parametrize(("params", "param"), [
    ({}, "start_time"),
    ({"start_time": 100, "bucket_width": "1w"}, "bucket_width"),
    ({"start_time": 100, "end_time": 50}, "end_time"),
    ({"start_time": 100, "group_by": "tenant"}, "group_by"),
    ({"start_time": 100, "bucket_width": "1d", "limit": 32}, "limit"),
    ({"start_time": 0, "end_time": 86400 * 3, "page": "7"}, "page"),
])
def test_bad_parameters_are_400s_naming_them(api, params, param):
    resp = api.client("usage-bad").get("/v1/usage", params=params)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param


def test_the_schema_documents_usage_and_deadlines(api):
    spec = api.client().get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    for model in ("JobPublic", "VideoPublic", "BatchPublic"):
        assert "usage" in schemas[model]["properties"], model
    assert {"render_seconds", "failed_render_seconds", "device", "characters",
            "audio_seconds", "video_seconds", "frames", "bytes"} <= set(
        schemas["UsagePublic"]["properties"])
    assert {"start_within_s", "max_run_s"} <= set(schemas["SpeechCreate"]["properties"])
    assert {"start_by", "max_run_s"} <= set(schemas["JobPublic"]["properties"])
    params = {p["name"] for p in spec["paths"]["/v1/usage"]["get"]["parameters"]}
    assert {"start_time", "end_time", "bucket_width", "group_by"} <= params
    assert "cancel-after" in {p["name"] for p in
                              spec["paths"]["/v1/audio/speech"]["post"]["parameters"]}


def test_a_job_a_deadline_ended_answers_a_409_with_its_reason(api):
    from api.service import deadline_ended

    key = new_key(api.db_url, "usage-" + uuid.uuid4().hex[:8])
    resp = api.client(key=key).post("/v1/audio/speech", headers={"Prefer": "respond-async"},
                                    json={"model": "tts-1", "input": "Too slow.",
                                          "max_run_s": 1})
    job_id = resp.json()["id"]
    jobs = api.services.jobs
    assert deadline_ended(jobs.get(job_id)) is None  # queued: no answer yet
    jobs.claim(job_id, "w", lease_s=60)
    assert jobs.cancel_overdue(job_id, 1, "past max_run_s", render=(1.0, "cpu"))
    answer = deadline_ended(jobs.get(job_id))
    assert (answer.http_status, answer.code) == (409, "deadline_exceeded")
