"""The render task's outcomes, run in-process on SQLite with a local store."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from core.jobs import JobStatus
from core.settings import Settings
from media.probe import probe_audio
from pipelines import get_spec
from storage.records import NewJob
from storage.repositories import KeyRepository
from tasks.app import make_celery
from tasks.recovery import reap_leases
from tasks.render import run_job
from tasks.runtime import WorkerRuntime


def outcome(result: str | Future) -> str:
    """run_job hands finalize to a background thread; wait for it."""
    return result.result() if isinstance(result, Future) else result


PIPELINES = ["piper-joe", "test-silent", "test-snapshots", "test-rate-change", "test-flaky",
             "test-video", "test-video-slow",
             "test-buggy"]


@pytest.fixture
def rt(tmp_path, sqlite_url):
    settings = Settings(home=tmp_path, database_url=sqlite_url, broker_url="memory://",
                        pipelines=PIPELINES, pipeline_modules=["tests.fake_pipelines"],
                        max_attempts=2, retry_backoff_s=0, lease_s=5, outbox_grace_s=0)
    return WorkerRuntime(settings)


@pytest.fixture
def app(rt):
    return make_celery(rt.settings)


@pytest.fixture
def tenant(rt):
    from storage.db import make_engine, make_sessionmaker

    return KeyRepository(make_sessionmaker(make_engine(rt.settings.db_url))).create_key("t")[0]


def submit(rt, tenant, pipeline, **request):
    spec = get_spec(pipeline)
    job, _ = rt.jobs.create(NewJob(
        tenant_id=tenant, kind=spec.kind, model=pipeline, pipeline=pipeline, queue=spec.queue,
        request={"input": "Hello there.", "response_format": "wav", **request}, metadata=None,
        max_attempts=rt.settings.max_attempts))
    return job


def test_completed_job_has_probed_output(rt, app, tenant):
    job = submit(rt, tenant, "piper-joe", response_format="flac")
    assert outcome(run_job(rt, app, job.id)) == "completed"
    done = rt.jobs.get(job.id)
    assert done.status is JobStatus.COMPLETED and done.progress == 100
    [out] = done.outputs
    assert out.key == f"{tenant}/{job.id}/a1/0.flac"
    probe = probe_audio(rt.store.get(out.key))
    assert probe.codec == "flac" and probe.sample_rate == 22050
    assert probe.duration_s == pytest.approx(out.duration_s, abs=1e-3)


def test_second_delivery_is_a_no_op(rt, app, tenant):
    job = submit(rt, tenant, "piper-joe")
    assert outcome(run_job(rt, app, job.id)) == "completed"
    assert outcome(run_job(rt, app, job.id)) == "skipped"
    assert rt.jobs.get(job.id).attempts == 1


def test_cumulative_snapshots_keep_the_longest(rt, app, tenant):
    job = submit(rt, tenant, "test-snapshots")
    assert outcome(run_job(rt, app, job.id)) == "completed"
    assert rt.jobs.get(job.id).outputs[0].duration_s == pytest.approx(2.0, abs=0.01)


@pytest.mark.parametrize(("pipeline", "code"), [("test-silent", "silent_audio"),
                                                ("test-rate-change", "audio_format_changed")])
def test_invalid_output_fails_at_once_with_reason(rt, app, tenant, pipeline, code):
    job = submit(rt, tenant, pipeline)
    assert outcome(run_job(rt, app, job.id)) == "failed"
    failed = rt.jobs.get(job.id)
    assert failed.status is JobStatus.FAILED and failed.error_code == code
    assert failed.attempts == 1 and failed.outputs == ()


def test_retryable_error_is_retried_then_fails(rt, app, tenant):
    job = submit(rt, tenant, "test-flaky")
    assert outcome(run_job(rt, app, job.id)) == "retrying"
    queued = rt.jobs.get(job.id)
    assert queued.status is JobStatus.QUEUED and queued.error_code == "pipeline_error"
    assert outcome(run_job(rt, app, job.id)) == "failed"
    failed = rt.jobs.get(job.id)
    assert failed.status is JobStatus.FAILED and failed.attempts == 2
    assert "engine died" in failed.error_message


def test_unexpected_error_fails_without_leaking_details(rt, app, tenant):
    job = submit(rt, tenant, "test-buggy")
    assert outcome(run_job(rt, app, job.id)) == "failed"
    failed = rt.jobs.get(job.id)
    assert failed.error_code == "internal_error"
    assert "KeyError" in failed.error_message
    assert "secret-internal-detail" not in failed.error_message


def test_reaper_requeues_then_fails_expired_leases(rt, app, tenant):
    job = submit(rt, tenant, "piper-joe")
    rt.jobs.claim(job.id, "dead-worker", lease_s=-1)
    assert reap_leases(rt, app) == 1
    requeued = rt.jobs.get(job.id)
    assert requeued.status is JobStatus.QUEUED and requeued.error_code == "lease_expired"
    rt.jobs.claim(job.id, "dead-again", lease_s=-1)
    assert reap_leases(rt, app) == 1
    failed = rt.jobs.get(job.id)
    assert failed.status is JobStatus.FAILED and failed.error_code == "lease_expired"


def test_reaper_spares_a_job_whose_heartbeat_won_the_race(rt, app, tenant):
    from tasks.recovery import reclaim

    job = submit(rt, tenant, "piper-joe")
    claimed = rt.jobs.claim(job.id, "w", lease_s=-1)
    stale_view = rt.jobs.expired_leases()[0]
    assert rt.jobs.heartbeat(job.id, claimed.attempts, lease_s=60)  # the worker is alive
    assert reclaim(rt, app, stale_view) is False
    assert rt.jobs.get(job.id).status is JobStatus.RUNNING
