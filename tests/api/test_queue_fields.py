"""A queued job's queue fields in GET and in the OpenAPI schema (in process: no worker
is live, so the estimates are null with their reason)."""

from __future__ import annotations

FIELDS = ("queue_position", "estimated_start_at", "estimated_completed_at",
          "estimate_unavailable_reason")


def test_the_schema_documents_the_queue_fields(api):
    schemas = api.app.openapi()["components"]["schemas"]
    for name in ("JobPublic", "VideoPublic"):
        props = schemas[name]["properties"]
        assert all(props[f].get("description") for f in FIELDS), name


def test_a_queued_job_says_where_it_stands_and_why_nothing_is_estimated(api):
    with api.client("queue-fields") as c:
        ids = [c.post("/v1/audio/speech", headers={"Prefer": "respond-async"},
                      json={"model": "tts-1", "input": f"Hello {i}."}).json()["id"]
               for i in range(3)]
        jobs = [c.get(f"/v1/jobs/{j}").json() for j in ids]
        listed = c.get("/v1/jobs").json()["data"]
    first, second, third = (j["queue_position"] for j in jobs)
    assert 0 <= first < second < third  # its tenant's own order (others may wait too)
    assert all(j["estimated_start_at"] is None and j["estimate_unavailable_reason"]
               == "no_live_worker" for j in jobs)
    assert all(j["queue_position"] is None for j in listed)  # each job's own GET has it


def test_the_first_read_after_an_idle_spell_agrees_with_itself(api, monkeypatch):
    """After an idle spell the registry view is stale: the first look at it answers from
    the old view and starts a refresh on a thread of its own. When that refresh lands
    between the two looks one GET takes (here: at once), the body must not say both "no
    live worker" (the estimate's reason) and nothing about waiting for one."""
    fleet = api.services.fleet
    with api.client("idle-spell") as c:
        job_id = c.post("/v1/audio/speech", headers={"Prefer": "respond-async"},
                        json={"model": "tts-1", "input": "After a while."}).json()["id"]
        pipeline = api.services.jobs.get(job_id).pipeline
        views = iter([{pipeline: 1}])  # the old view once (a worker served it), then now
        monkeypatch.setattr(fleet, "counts", lambda: next(views, {pipeline: 0}))
        job = c.get(f"/v1/jobs/{job_id}").json()
    no_worker = job["estimate_unavailable_reason"] == "no_live_worker"
    assert (job["status_detail"] == "waiting for a worker") == no_worker, job
