"""Ids, signatures and metadata are checked by their format; a resource that vanished
between two repository calls is a 404, never a 500."""

from __future__ import annotations

import json
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient

from storage.repositories import JobRepository

from ..integration.helpers import assert_openai_error


@pytest.fixture(scope="module")
def client(api):
    with api.client("ids-" + uuid.uuid4().hex[:8]) as c:
        yield c


@pytest.mark.parametrize("signature", ["é" * 64, "zz" * 32, "0" * 63, "A" * 64, "%00"])
def test_malformed_signature_is_403(api, signature):
    with api.client() as anon:
        resp = anon.get("/v1/objects/t/j/0.wav", params={"expires": 1, "signature": signature})
    assert_openai_error(resp, 403, "signature_invalid")


def test_deeply_nested_metadata_text_is_400(client):
    nested = "[" * 20_000 + "]" * 20_000  # far past the parser's recursion limit
    resp = client.post("/v1/videos", data={"prompt": "A lighthouse.", "metadata": nested})
    assert assert_openai_error(resp, 400)["param"] == "metadata"
    assert client.get("/v1/videos").json()["data"] == []


@pytest.mark.parametrize("path", ["/v1/jobs/%00", "/v1/jobs/job_%00", "/v1/videos/%00",
                                  "/v1/jobs/%00/content", "/v1/videos/%00/content",
                                  "/v1/webhook_endpoints/we_%00", "/v1/files/file-%00",
                                  "/v1/files/%00/content", "/v1/batches/batch_%00"])
def test_id_with_nul_is_404(client, path):
    assert_openai_error(client.get(path), 404, "not_found")


def test_nul_cursor_is_400(client):
    for path in ("/v1/jobs", "/v1/videos", "/v1/webhook_endpoints", "/v1/files",
                 "/v1/batches"):
        resp = client.get(path, params={"after": "\x00"})
        assert assert_openai_error(resp, 400, "invalid_cursor")["param"] == "after"


def test_unknown_id_of_the_valid_format_is_quoted_in_full(client):
    job_id, video_id = "job_" + "0" * 32, "video_" + "f" * 32
    assert job_id in assert_openai_error(client.get(f"/v1/jobs/{job_id}"), 404)["message"]
    err = assert_openai_error(client.get(f"/v1/videos/{video_id}"), 404)
    assert video_id in err["message"]


def test_malformed_id_is_not_echoed_beyond_32_characters(client):
    bad = "job_" + "x" * 200
    err = assert_openai_error(client.get(f"/v1/jobs/{bad}"), 404, "not_found")
    assert bad[:33] not in err["message"]


class DeletedMeanwhile(JobRepository):
    """A repository whose rows vanish just before a cancel: what a concurrent DELETE of
    the same video does between the route's read and its cancel."""

    def cancel(self, job_id: str, tenant_id: str):
        self.delete(job_id, tenant_id)
        return super().cancel(job_id, tenant_id)


@pytest.fixture
def racing(api):
    original = api.services.jobs
    api.services.jobs = DeletedMeanwhile(original._sessions)
    yield
    api.services.jobs = original


def _queued_video(client) -> str:
    resp = client.post("/v1/videos", json={"prompt": "A lighthouse.", "seconds": 1})
    assert resp.status_code == 200, resp.text
    return resp.json()["id"]


def test_delete_of_a_video_deleted_meanwhile_is_404(client, racing):
    video_id = _queued_video(client)
    assert_openai_error(client.delete(f"/v1/videos/{video_id}"), 404, "not_found")


def test_cancel_of_a_job_deleted_meanwhile_is_404(client, racing):
    video_id = _queued_video(client)
    assert_openai_error(client.post(f"/v1/jobs/{video_id}/cancel"), 404, "not_found")


def test_second_delete_is_404(client):
    video_id = _queued_video(client)
    assert client.delete(f"/v1/videos/{video_id}").status_code == 200
    assert_openai_error(client.delete(f"/v1/videos/{video_id}"), 404, "not_found")


def _race(app, key: str, requests: list[tuple[str, str]]) -> list[int]:
    """Send the requests at the same moment, each from its own thread and client."""
    barrier = threading.Barrier(len(requests))

    def call(method: str, path: str) -> int:
        with TestClient(app, headers={"Authorization": key}) as own:
            barrier.wait()
            return own.request(method, path).status_code

    with ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(lambda args: call(*args), requests))


def test_concurrent_deletes_and_cancels_never_500(api, client):
    """The real race, a few times over: whatever the interleaving, one DELETE wins and
    the other request is a 404 (or a cancel that won first, or a 409 for a cancel that
    came after the DELETE's own cancel)."""
    for _ in range(4):
        video_id = _queued_video(client)
        statuses = _race(api.app, client.headers["authorization"], [
            ("DELETE", f"/v1/videos/{video_id}"), ("DELETE", f"/v1/videos/{video_id}"),
            ("POST", f"/v1/jobs/{video_id}/cancel")])
        assert sorted(statuses[:2]) == [200, 404], statuses
        assert statuses[2] in (200, 404, 409), statuses


# ---- pagination cursors -----------------------------------------------------------------

def test_unknown_endpoint_cursor_is_400_not_page_one(client):
    resp = client.get("/v1/webhook_endpoints", params={"after": "we_" + "0" * 32})
    assert_openai_error(resp, 400, "invalid_cursor")
    assert_openai_error(client.delete("/v1/webhook_endpoints/we_%00"), 404, "not_found")


def test_unknown_cursor_is_400_not_page_one(client):
    _queued_video(client)
    unknown = "video_" + uuid.uuid4().hex
    for path in ("/v1/jobs", "/v1/videos"):
        resp = client.get(path, params={"after": unknown})
        assert assert_openai_error(resp, 400, "invalid_cursor")["param"] == "after"


def test_deleted_cursor_is_400(client):
    first, second = _queued_video(client), _queued_video(client)
    page = client.get("/v1/videos", params={"limit": 1, "order": "asc"}).json()
    assert page["has_more"]
    assert client.delete(f"/v1/videos/{second}").status_code == 200
    assert client.delete(f"/v1/videos/{first}").status_code == 200
    resp = client.get("/v1/videos", params={"after": second})
    assert_openai_error(resp, 400, "invalid_cursor")


def test_another_tenants_cursor_is_400(api, client):
    foreign = _queued_video(client)
    with api.client("cursor-" + uuid.uuid4().hex[:8]) as other:
        assert_openai_error(other.get("/v1/jobs", params={"after": foreign}), 400,
                            "invalid_cursor")


# ---- idempotency --------------------------------------------------------------------

def test_idempotency_key_with_different_metadata_is_409(client):
    key = {"Idempotency-Key": "meta-" + uuid.uuid4().hex, "Prefer": "respond-async"}
    body = {"model": "tts-1", "input": "Same words.", "metadata": {"order": "1"}}
    first = client.post("/v1/audio/speech", headers=key, json=body)
    assert first.status_code == 202, first.text
    again = client.post("/v1/audio/speech", headers=key, json=body)
    assert again.status_code == 202 and again.json()["id"] == first.json()["id"]
    changed = client.post("/v1/audio/speech", headers=key,
                          json={**body, "metadata": {"order": "2"}})
    assert_openai_error(changed, 409, "idempotency_key_reused")
    dropped = client.post("/v1/audio/speech", headers=key,
                          json={k: v for k, v in body.items() if k != "metadata"})
    assert_openai_error(dropped, 409, "idempotency_key_reused")


def test_idempotency_key_compares_video_metadata(client):
    key = {"Idempotency-Key": "vmeta-" + uuid.uuid4().hex}
    form = {"prompt": "A lighthouse.", "seconds": "1", "metadata": json.dumps({"a": "1"})}
    first = client.post("/v1/videos", headers=key, data=form)
    assert first.status_code == 200, first.text
    resp = client.post("/v1/videos", headers=key,
                       data={**form, "metadata": json.dumps({"a": "2"})})
    assert_openai_error(resp, 409, "idempotency_key_reused")
