"""Files expire and have a quota: OpenAI's ``expires_after`` on upload (batch files expire
after 30 days by default), a per-tenant storage quota (413), expiry that deletes the
bytes and keeps the record (``expired``, content 410), and the batch's
``output_expires_after`` (in process over PostgreSQL and the local store)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import update

from core.errors import NotFound
from storage.models import File
from tasks.retention import expire_files
from tasks.runtime import WorkerRuntime

from ..integration.helpers import assert_openai_error

DAY = 86400
POLICY = "expires_after[anchor]", "expires_after[seconds]"


def upload(client, data: bytes = b"{}\n", **form):
    return client.post("/v1/files", data={"purpose": "batch", **form},
                       files={"file": ("in.jsonl", data, "application/jsonl")})


def policy(anchor: str, seconds: str) -> dict[str, str]:
    return dict(zip(POLICY, (anchor, seconds), strict=True))


@pytest.fixture
def client(api):
    with api.client("files-" + uuid.uuid4().hex[:8]) as c:
        yield c


def test_batch_files_expire_after_30_days_unless_they_say(client):
    default = upload(client).json()
    assert default["expires_at"] - default["created_at"] == 30 * DAY
    hour = upload(client, **policy("created_at", "3600")).json()
    assert hour["expires_at"] - hour["created_at"] == 3600
    assert client.get(f"/v1/files/{hour['id']}").json()["expires_at"] == hour["expires_at"]


@pytest.mark.parametrize("form", [
    policy("last_active_at", "3600"), policy("created_at", "60"),
    policy("created_at", str(30 * DAY + 1)), policy("created_at", "soon"),
    {POLICY[1]: "3600"}, {POLICY[0]: "created_at"}, {"expires_after": "3600"}])
def test_an_invalid_policy_is_400(client, form):
    err = assert_openai_error(upload(client, **form), 400)
    assert err["param"] == "expires_after", err
    assert client.get("/v1/files").json()["data"] == []


def test_the_storage_quota_refuses_an_upload_past_it(make_api):
    api = make_api(tenant_storage_bytes=4096)
    tenant = "quota-" + uuid.uuid4().hex[:8]
    with api.client(tenant) as c:
        first = upload(c, b"x" * 3000)
        assert first.status_code == 200, first.text
        err = assert_openai_error(upload(c, b"y" * 2000), 413, "storage_quota_exceeded")
        assert "4096" in err["message"]
        assert [f["id"] for f in c.get("/v1/files").json()["data"]] == [first.json()["id"]]
        tenant_id = api.services.files.get(first.json()["id"]).tenant_id
        assert len(list(api.services.store.list_keys(f"{tenant_id}/files/"))) == 1
        assert c.delete(f"/v1/files/{first.json()['id']}").status_code == 200
        assert upload(c, b"y" * 2000).status_code == 200


def test_an_expired_file_keeps_its_record_and_its_content_is_410(api, client):
    created = upload(client, **policy("created_at", "3600")).json()
    record = api.services.files.get(created["id"])
    with api.app.state.engine.begin() as conn:
        conn.execute(update(File).where(File.id == record.id).values(
            expires_at=datetime.now(UTC) - timedelta(seconds=1)))
    assert expire_files(WorkerRuntime(api.settings)) >= 1
    with pytest.raises(NotFound):
        api.services.store.get(record.key)
    shown = client.get(f"/v1/files/{record.id}").json()
    assert shown["status"] == "expired" and shown["bytes"] == 3
    assert_openai_error(client.get(f"/v1/files/{record.id}/content"), 410, "file_expired")
    resp = client.post("/v1/batches", json={"input_file_id": record.id,
                                            "endpoint": "/v1/audio/speech",
                                            "completion_window": "24h"})
    assert assert_openai_error(resp, 400, "invalid_input_file")["param"] == "input_file_id"
    assert client.delete(f"/v1/files/{record.id}").status_code == 200


@pytest.mark.parametrize(("body", "status"), [
    ({"anchor": "created_at", "seconds": 7200}, 200),
    ({"anchor": "created_at", "seconds": 10}, 400),
    ({"anchor": "completed_at", "seconds": 7200}, 400),
    ({"seconds": 7200}, 400)])
def test_batches_take_output_expires_after(client, body, status):
    source = upload(client).json()
    resp = client.post("/v1/batches", json={
        "input_file_id": source["id"], "endpoint": "/v1/audio/speech",
        "completion_window": "24h", "output_expires_after": body})
    assert resp.status_code == status, resp.text
    if status == 400:
        assert resp.json()["error"]["param"].startswith("output_expires_after")
