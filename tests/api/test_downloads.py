"""Downloads that race a DELETE or retention answer 404/410 in OpenAI's error shape (or
finish with the bytes they started with), and malformed ``Range`` headers answer in the
same shape, on every route that serves stored bytes (embedded mode: the local store)."""

from __future__ import annotations

import uuid
from urllib.parse import urlsplit

import pytest

from storage.objects import LocalStore
from storage.records import OutputRecord

from ..integration.helpers import assert_openai_error

DATA = bytes(range(256)) * 512  # 128 kB: more than one chunk of a response


@pytest.fixture
def stored(api):
    """An object in the app's store and the path of its signed URL."""
    key = f"ten_dl/{uuid.uuid4().hex}/0.wav"
    api.services.store.put(key, DATA, "audio/wav")
    url, _ = api.services.store.signed_url(key, 600)
    parts = urlsplit(url)
    return key, f"{parts.path}?{parts.query}"


def deleted_after_the_check(monkeypatch, store: LocalStore) -> None:
    """The DELETE (or retention) lands right after the route found the object."""
    found = LocalStore.file

    def file_then_gone(self, key):
        path = found(self, key)
        store.delete([key])
        return path
    monkeypatch.setattr(LocalStore, "file", file_then_gone)


def test_a_signed_download_racing_a_delete_is_404(api, stored, monkeypatch):
    _, path = stored
    deleted_after_the_check(monkeypatch, api.services.store)
    with api.client() as anon:
        assert_openai_error(anon.get(path), 404, "not_found")
        resp = anon.head(path)
        assert resp.status_code == 404


def test_a_stream_that_started_finishes_with_its_bytes(api, stored):
    key, _ = stored
    chunks = api.services.store.stream(key)
    api.services.store.delete([key])
    assert b"".join(chunks) == DATA


@pytest.mark.parametrize("header", ["bytes=abc", "bytes=5-2", "pages=0-1", "bytes=-"])
def test_a_malformed_range_is_400_in_the_error_shape(api, stored, header):
    _, path = stored
    with api.client() as anon:
        err = assert_openai_error(anon.get(path, headers={"Range": header}), 400,
                                  "invalid_range")
    assert err["param"] == "Range"


def test_an_unsatisfiable_range_is_416_in_the_error_shape(api, stored):
    _, path = stored
    with api.client() as anon:
        resp = anon.get(path, headers={"Range": f"bytes={len(DATA) + 10}-"})
    assert_openai_error(resp, 416, "range_not_satisfiable")
    assert resp.headers["content-range"] == f"bytes */{len(DATA)}"


def test_a_good_range_still_works(api, stored):
    _, path = stored
    with api.client() as anon:
        resp = anon.get(path, headers={"Range": "bytes=10-19"})
    assert resp.status_code == 206 and resp.content == DATA[10:20]
    assert resp.headers["content-range"] == f"bytes 10-19/{len(DATA)}"


def test_file_content_racing_a_delete_is_404(api, monkeypatch):
    with api.client("dl-" + uuid.uuid4().hex[:8]) as client:
        created = client.post("/v1/files", data={"purpose": "batch"},
                              files={"file": ("in.jsonl", b"{}\n", "application/jsonl")})
        assert created.status_code == 200, created.text
        deleted_after_the_check(monkeypatch, api.services.store)
        resp = client.get(f"/v1/files/{created.json()['id']}/content")
    assert_openai_error(resp, 404, "not_found")


def test_job_content_racing_a_delete_is_404(api, monkeypatch):
    with api.client("dl-" + uuid.uuid4().hex[:8]) as client:
        resp = client.post("/v1/audio/speech", json={"model": "tts-1", "input": "Hi."},
                           headers={"Prefer": "respond-async"})
        job_id = resp.json()["id"]
        jobs = api.services.jobs
        job = jobs.claim(job_id, "test-worker", 60)
        key = f"{job.tenant_id}/{job_id}/a1/0.wav"
        api.services.store.put(key, DATA, "audio/wav")
        assert jobs.complete(job_id, 1, [OutputRecord(
            index=0, key=key, content_type="audio/wav", bytes=len(DATA), sha256="0" * 64,
            duration_s=1.0, sample_rate=22050, channels=1)], 3600)
        assert client.get(f"/v1/jobs/{job_id}/content").content == DATA
        deleted_after_the_check(monkeypatch, api.services.store)
        resp = client.get(f"/v1/jobs/{job_id}/content")
    assert assert_openai_error(resp, 404, "not_found")["param"] == "index"
