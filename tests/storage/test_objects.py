"""Object stores: the local disk store and S3 (a real SeaweedFS with credentials)."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from core.errors import NotFound, SignatureInvalid, StorageFailed
from core.settings import Settings
from storage.objects import CHUNK, LocalStore, S3Store, make_store

from ..services import free_port

SECRET = "local-store-test-signing-secret"


# ---- local store ------------------------------------------------------------------------


@pytest.fixture
def local(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "objects", "http://api.test:8000/", SECRET)


def _params(url: str) -> tuple[str, int, str]:
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    return parts.path, int(query["expires"][0]), query["signature"][0]


def test_local_put_get_round_trip(local: LocalStore) -> None:
    data = os.urandom(3 * CHUNK + 17)
    local.put("jobs/a/0.wav", data, "audio/wav")
    assert local.get("jobs/a/0.wav") == data
    assert b"".join(local.stream("jobs/a/0.wav")) == data
    assert (local.root / "jobs/a/0.wav").read_bytes() == data
    # No temporary files are left next to the object.
    assert [p.name for p in (local.root / "jobs/a").iterdir()] == ["0.wav"]

    local.put("jobs/a/0.wav", b"second", "audio/wav")
    assert local.get("jobs/a/0.wav") == b"second"


def test_local_missing_and_deleted_objects(local: LocalStore) -> None:
    with pytest.raises(NotFound):
        local.get("nope/0.wav")
    with pytest.raises(NotFound):
        local.stream("nope/0.wav")
    local.put("k/1.bin", b"abc", "application/octet-stream")
    local.delete(["k/1.bin", "k/never-existed.bin"])
    with pytest.raises(NotFound):
        local.get("k/1.bin")


def test_local_signed_url_verifies(local: LocalStore) -> None:
    key = "jobs/b/0.wav"
    before = int(time.time())
    url, expires = local.signed_url(key, ttl_s=60)
    assert url.startswith("http://api.test:8000/v1/objects/jobs/b/0.wav?")
    path, url_expires, signature = _params(url)
    assert path == "/v1/objects/" + key
    assert url_expires == expires
    assert before + 60 <= expires <= int(time.time()) + 60
    local.verify(key, expires, signature)  # does not raise


def test_local_tampered_signature_is_refused(local: LocalStore) -> None:
    key = "jobs/c/0.wav"
    url, expires = local.signed_url(key, ttl_s=60)
    _, _, signature = _params(url)
    flipped = signature[:-1] + ("0" if signature[-1] != "0" else "1")
    for bad_key, bad_expires, bad_sig in [
        (key, expires, flipped),
        (key, expires + 3600, signature),  # extended expiry
        ("jobs/other/0.wav", expires, signature),  # another object
        (key, expires, ""),
    ]:
        with pytest.raises(SignatureInvalid) as err:
            local.verify(bad_key, bad_expires, bad_sig)
        assert err.value.code == "signature_invalid"
        assert err.value.http_status == 403


def test_local_signature_from_another_secret_is_refused(tmp_path: Path) -> None:
    ours = LocalStore(tmp_path / "a", "http://x", SECRET)
    theirs = LocalStore(tmp_path / "b", "http://x", "a-different-signing-secret")
    _, expires, signature = _params(theirs.signed_url("k", ttl_s=60)[0])
    with pytest.raises(SignatureInvalid):
        ours.verify("k", expires, signature)


def test_local_expired_signature_is_refused(local: LocalStore) -> None:
    key = "jobs/d/0.wav"
    expires = int(time.time()) - 5
    with pytest.raises(SignatureInvalid) as err:
        local.verify(key, expires, local._sign(key, expires))
    assert err.value.code == "signature_expired"


def test_local_signed_url_with_short_ttl_expires(local: LocalStore) -> None:
    url, expires = local.signed_url("k", ttl_s=1)
    _, _, signature = _params(url)
    local.verify("k", expires, signature)
    time.sleep(2.1)
    with pytest.raises(SignatureInvalid) as err:
        local.verify("k", expires, signature)
    assert err.value.code == "signature_expired"


@pytest.mark.parametrize("key", ["../x", "../../etc/passwd", "a/../../x", "/etc/passwd", ""])
def test_local_path_traversal_is_not_found(local: LocalStore, key: str) -> None:
    outside = local.root.parent / "x"
    outside.write_bytes(b"outside")
    with pytest.raises(NotFound):
        local.get(key)
    with pytest.raises(NotFound):
        local.put(key, b"evil", "text/plain")
    with pytest.raises(NotFound):
        local.stream(key)
    assert outside.read_bytes() == b"outside"


def test_local_check(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "objects", "http://x", SECRET)
    store.check()
    store.root.rmdir()
    with pytest.raises(StorageFailed) as err:
        store.check()
    assert err.value.retryable is True


def test_make_store_defaults_to_local(tmp_path: Path) -> None:
    store = make_store(Settings(home=tmp_path, signing_secret=SECRET))
    assert isinstance(store, LocalStore)
    assert store.root == (tmp_path / "objects").resolve()
    assert store.root.is_dir()


# ---- S3 (SeaweedFS) ---------------------------------------------------------------------


def s3_settings(sw, **extra) -> Settings:
    values = dict(object_store="s3", s3_endpoint_url=sw.endpoint,
                  s3_bucket="store-test-" + uuid.uuid4().hex[:12],
                  s3_access_key_id=sw.access_key, s3_secret_access_key=sw.secret_key)
    values.update(extra)
    return Settings(**values)


@pytest.fixture(scope="module")
def s3(seaweedfs) -> S3Store:
    # One bucket for every test that writes: SeaweedFS gives each bucket that holds data
    # its own set of volumes, and the shared test server has room for only a few.
    store = make_store(s3_settings(seaweedfs))
    assert isinstance(store, S3Store)
    return store


def test_s3_bucket_is_created_on_construction(seaweedfs) -> None:
    settings = s3_settings(seaweedfs)
    store = S3Store(settings)
    names = {b["Name"] for b in store._client.list_buckets()["Buckets"]}
    assert settings.s3_bucket in names
    store.check()
    # Constructing again on an existing bucket is fine.
    S3Store(settings).check()


def test_s3_without_create_bucket_fails_check(seaweedfs) -> None:
    store = S3Store(s3_settings(seaweedfs, s3_create_bucket=False))
    with pytest.raises((StorageFailed, NotFound)):
        store.check()


def test_s3_put_get_stream_round_trip(s3: S3Store) -> None:
    data = os.urandom(2 * CHUNK + 123)
    s3.put("jobs/a/0.wav", data, "audio/wav")
    assert s3.get("jobs/a/0.wav") == data
    assert b"".join(s3.stream("jobs/a/0.wav")) == data
    head = s3._client.head_object(Bucket=s3.bucket, Key="jobs/a/0.wav")
    assert head["ContentType"] == "audio/wav"
    assert head["ContentLength"] == len(data)

    s3.put("jobs/a/0.wav", b"overwritten", "audio/wav")
    assert s3.get("jobs/a/0.wav") == b"overwritten"


def test_s3_missing_key_is_not_found(s3: S3Store) -> None:
    with pytest.raises(NotFound):
        s3.get("does/not/exist")
    with pytest.raises(NotFound):
        s3.stream("does/not/exist")


def test_s3_delete(s3: S3Store) -> None:
    s3.put("d/1", b"1", "text/plain")
    s3.put("d/2", b"2", "text/plain")
    s3.delete(["d/1", "d/2", "d/never"])
    for key in ("d/1", "d/2"):
        with pytest.raises(NotFound):
            s3.get(key)
    s3.delete([])


def test_s3_signed_url_downloads_without_credentials(s3: S3Store) -> None:
    data = os.urandom(4096)
    s3.put("jobs/b/0.wav", data, "audio/wav")
    before = int(time.time())
    url, expires = s3.signed_url("jobs/b/0.wav", ttl_s=60)
    assert before + 60 <= expires <= int(time.time()) + 60
    assert "X-Amz-Signature=" in url
    resp = httpx.get(url, timeout=10)
    assert resp.status_code == 200
    assert resp.content == data


def test_s3_unsigned_url_is_refused(s3: S3Store, seaweedfs) -> None:
    data = b"private bytes"
    s3.put("jobs/c/0.wav", data, "audio/wav")
    resp = httpx.get(f"{seaweedfs.endpoint}/{s3.bucket}/jobs/c/0.wav", timeout=10)
    assert resp.status_code == 403
    assert data not in resp.content


def test_s3_signed_url_expires(s3: S3Store) -> None:
    data = b"short lived"
    s3.put("jobs/d/0.wav", data, "audio/wav")
    url, _ = s3.signed_url("jobs/d/0.wav", ttl_s=1)
    time.sleep(2.5)
    resp = httpx.get(url, timeout=10)
    assert resp.status_code == 403
    assert data not in resp.content


def test_s3_tampered_signature_is_refused(s3: S3Store) -> None:
    data = b"tamper proof"
    s3.put("jobs/e/0.wav", data, "audio/wav")
    url, _ = s3.signed_url("jobs/e/0.wav", ttl_s=60)
    sig = parse_qs(urlsplit(url).query)["X-Amz-Signature"][0]
    flipped = sig[:-1] + ("0" if sig[-1] != "0" else "1")
    resp = httpx.get(url.replace(sig, flipped), timeout=10)
    assert resp.status_code == 403
    assert data not in resp.content

    # A valid signature for one key does not open another key.
    s3.put("jobs/e/1.wav", b"other object", "audio/wav")
    other = url.replace("jobs/e/0.wav", "jobs/e/1.wav")
    resp = httpx.get(other, timeout=10)
    assert resp.status_code == 403
    assert b"other object" not in resp.content


def test_s3_public_endpoint_is_used_for_presigning(seaweedfs) -> None:
    store = S3Store(s3_settings(seaweedfs, s3_public_endpoint_url="http://files.example:9000"))
    url, _ = store.signed_url("k", ttl_s=60)
    assert url.startswith(f"http://files.example:9000/{store.bucket}/k?")


def test_s3_unreachable_endpoint_is_retryable_storage_failure() -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    settings = Settings(object_store="s3", s3_endpoint_url=endpoint, s3_bucket="unreachable",
                        s3_access_key_id="k", s3_secret_access_key="s")
    # Start-up tolerates an unreachable store (the API must come up; /readyz says why)...
    started = S3Store(settings)
    with pytest.raises(StorageFailed) as err:
        started.check()
    assert err.value.retryable is True
    assert err.value.code == "storage_error"

    store = S3Store(settings.model_copy(update={"s3_create_bucket": False}))
    for call in (lambda: store.put("k", b"x", "text/plain"), lambda: store.get("k"),
                 store.check):
        with pytest.raises(StorageFailed) as err:
            call()
        assert err.value.retryable is True
