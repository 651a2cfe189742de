"""Maintenance runs where render work cannot hold it up, and keeps the store tidy:
relay and reaper while the only render worker is busy, retention, orphans."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, update

from core.jobs import JobKind
from pipelines import queue_for
from storage.db import make_engine, make_sessionmaker
from storage.models import Job, OutboxMessage
from storage.records import NewJob
from storage.repositories import JobRepository, KeyRepository, OutboxRepository

from ..services import wait_until
from .helpers import assert_openai_error, wait_job

WITHIN_S = 20  # longer than every period of the former beat schedule (5 s and 10 s)


@pytest.fixture(scope="module")
def db(stack_db):
    sessions = make_sessionmaker(make_engine(stack_db))
    tenant, key = KeyRepository(sessions).create_key("upkeep-" + uuid.uuid4().hex[:8])
    return sessions, tenant, key


def new_job(tenant: str, pipeline: str = "piper-joe") -> NewJob:
    return NewJob(tenant_id=tenant, kind=JobKind.SPEECH, model=pipeline, pipeline=pipeline,
                  queue=queue_for(pipeline), metadata=None, max_attempts=3,
                  request={"input": "Kept safe.", "response_format": "wav"})


def test_relay_and_reaper_run_while_the_only_render_worker_is_busy(stack, db):
    sessions, tenant, key = db
    jobs, outbox = JobRepository(sessions), OutboxRepository(sessions)

    def published(job_id: str) -> bool:
        with sessions() as s:
            return s.scalar(select(OutboxMessage.published_at).where(
                OutboxMessage.job_id == job_id)) is not None

    with stack.client(key) as c:
        busy = c.post("/v1/audio/speech", headers={"Prefer": "respond-async"},
                      json={"model": "test-sleep", "input": "120"}).json()["id"]
        try:
            wait_job(c, busy, 30, until=lambda j: j["status"] == "running")
            # A job whose publish failed (still in the outbox), and one whose worker died.
            unpublished, _ = jobs.create(new_job(tenant))
            orphaned, msg = jobs.create(new_job(tenant))
            outbox.mark_published([msg.id])
            jobs.claim(orphaned.id, "dead-worker:1", lease_s=-1)

            def recovered() -> bool:
                reclaimed = jobs.get(orphaned.id)
                return (published(unpublished.id) and reclaimed.error_code == "lease_expired"
                        and reclaimed.status.value == "queued")

            wait_until(recovered, WITHIN_S, "relay and reaper beside a busy render worker")
            reaped = [json.loads(line) for line in stack.processes["maintenance"].log
                      .read_text().splitlines() if orphaned.id in line]
            assert [r["job_id"] for r in reaped] == [orphaned.id]  # named, in its field
            assert "attempt 1 of 3; queued again" in reaped[0]["message"]
            assert c.get(f"/v1/jobs/{busy}").json()["status"] == "running"
        finally:
            c.post(f"/v1/jobs/{busy}/cancel")
        for job_id in (unpublished.id, orphaned.id):
            done = wait_job(c, job_id, 60)
            assert done["status"] == "completed", done
        assert wait_job(c, orphaned.id)["attempts"] == 2


def speak(c, text: str) -> str:
    """A completed speech job's id."""
    resp = c.post("/v1/audio/speech", json={"model": "tts-1", "input": text,
                                            "response_format": "wav"})
    assert resp.status_code == 200, resp.text
    return resp.headers["x-job-id"]


def _keys(s3, bucket: str, prefix: str) -> list[str]:
    return [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix)
            .get("Contents", [])]


def test_expired_outputs_are_deleted_and_answer_410(stack, db, seaweedfs):
    sessions, tenant, key = db
    s3, bucket = seaweedfs.client(), stack.env["OMNIJOBS_S3_BUCKET"]
    with stack.client(key) as c:
        job_id = speak(c, "Gone soon.")
        job = c.get(f"/v1/jobs/{job_id}").json()
        assert job["expires_at"] == job["completed_at"] + 7 * 86400
        assert _keys(s3, bucket, f"{tenant}/{job_id}/")
        with sessions.begin() as s:  # the retention period has passed
            s.execute(update(Job).where(Job.id == job_id).values(
                expires_at=Job.completed_at))
        [out] = c.get(f"/v1/jobs/{job_id}").json()["outputs"]
        assert out["expired"] is True and out["url"] is None and out["bytes"] > 0
        assert_openai_error(c.get(f"/v1/jobs/{job_id}/content"), 410, "output_expired")
        wait_until(lambda: not _keys(s3, bucket, f"{tenant}/{job_id}/"), WITHIN_S,
                   "maintenance to delete the expired objects")
        assert c.get(f"/v1/jobs/{job_id}").json()["status"] == "completed"
        with sessions.begin() as s:  # and the job's own retention period too
            s.execute(update(Job).where(Job.id == job_id).values(
                completed_at=datetime.now(UTC) - timedelta(days=31)))
        wait_until(lambda: c.get(f"/v1/jobs/{job_id}").status_code == 404, WITHIN_S,
                   "maintenance to delete the expired job")


def test_objects_no_job_owns_are_swept(stack, db, seaweedfs):
    _, tenant, key = db
    s3, bucket = seaweedfs.client(), stack.env["OMNIJOBS_S3_BUCKET"]
    with stack.client(key) as c:
        live = f"{tenant}/{speak(c, 'Keep me.')}/"
    orphan = f"{tenant}/job_{uuid.uuid4().hex}/0.wav"  # a deleted job's late upload
    s3.put_object(Bucket=bucket, Key=orphan, Body=b"late")
    wait_until(lambda: not _keys(s3, bucket, orphan), WITHIN_S, "the orphan sweep")
    time.sleep(1.5)  # one more sweep period: the live job's object stays
    assert _keys(s3, bucket, live)
