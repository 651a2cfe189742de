"""The render task with deadlines and usage, in-process on SQLite: a claim that comes
after the start deadline expires the job before the pipeline runs; a cooperative
pipeline past the caller's max_run_s ends ``cancelled``/``deadline_exceeded`` without
recycling the process; each attempt's time is on its job's usage record and in the
worker's Prometheus counter, the same seconds."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import REGISTRY

from core.jobs import JobStatus
from tasks.render import run_job

from . import test_render
from .test_render import outcome, submit

rt, app, tenant = test_render.rt, test_render.app, test_render.tenant  # the same fixtures


def counted(pipeline: str) -> float:
    return REGISTRY.get_sample_value("omnijobs_render_seconds_total",
                                     {"pipeline": pipeline, "tenant": ""}) or 0.0


def with_deadlines(runtime, job, **deadlines):
    """The submitted job again, with its deadlines (as the API's submit writes them)."""
    runtime.jobs.delete(job.id, job.tenant_id)
    new, _ = runtime.jobs.create(replace(_new_job(job), **deadlines))
    return new


def _new_job(job):
    from pipelines import get_spec
    from storage.records import NewJob

    return NewJob(tenant_id=job.tenant_id, kind=job.kind, model=job.model,
                  pipeline=job.pipeline, queue=get_spec(job.pipeline).queue,
                  request=job.request, metadata=None, max_attempts=job.max_attempts)


def test_a_claim_after_the_start_deadline_expires_the_job_unrun(rt, app, tenant):
    job = with_deadlines(rt, submit(rt, tenant, "piper-joe"),
                         start_by=datetime.now(UTC) - timedelta(seconds=1))
    before = counted("piper-joe")
    assert outcome(run_job(rt, app, job.id)) == "expired"
    ended = rt.jobs.get(job.id)
    assert (ended.status, ended.error_code, ended.outputs) == (
        JobStatus.EXPIRED, "start_deadline_exceeded", ())
    assert [a.outcome for a in rt.jobs.attempts(job.id)] == ["expired"]
    assert counted("piper-joe") == before  # nothing rendered, nothing counted


def test_past_max_run_s_a_cooperative_pipeline_is_cancelled_and_the_process_kept(
        rt, app, tenant, monkeypatch):
    recycled = []
    monkeypatch.setattr(rt, "recycle", lambda: recycled.append(True))
    job = with_deadlines(rt, submit(rt, tenant, "test-video-slow", prompt="ok",
                                    seconds=1.0, size="64x48", fps=24), max_run_s=0.6)
    assert outcome(run_job(rt, app, job.id)) == "deadline_exceeded"
    ended = rt.jobs.get(job.id)
    assert (ended.status, ended.error_code) == (JobStatus.CANCELLED, "deadline_exceeded")
    assert recycled == []  # it stopped at its next check: the model stays loaded
    assert ended.usage.render_s >= 0.6 and ended.usage.failed_render_s == ended.usage.render_s


def test_max_run_s_equal_to_the_pipelines_limit_is_still_the_callers_deadline(
        rt, app, tenant, monkeypatch):
    """The API accepts max_run_s up to the pipeline's maximum runtime, inclusive: at the
    limit itself it is still the caller's bound (deadline_exceeded, final), not the
    pipeline's (a timeout, retried)."""
    monkeypatch.setattr(rt, "recycle", lambda: None)
    monkeypatch.setattr(rt, "max_runtime_s", lambda name: 0.6)
    job = with_deadlines(rt, submit(rt, tenant, "test-video-slow", prompt="ok",
                                    seconds=1.0, size="64x48", fps=24), max_run_s=0.6)
    assert outcome(run_job(rt, app, job.id)) == "deadline_exceeded"
    ended = rt.jobs.get(job.id)
    assert (ended.status, ended.error_code, ended.attempts) == (
        JobStatus.CANCELLED, "deadline_exceeded", 1)


def test_each_attempts_time_is_its_usage_and_the_workers_counter(rt, app, tenant):
    before_ok, before_bad = counted("piper-joe"), counted("test-silent")
    done = [submit(rt, tenant, "piper-joe") for _ in range(3)]
    bad = submit(rt, tenant, "test-silent")
    for job in (*done, bad):
        outcome(run_job(rt, app, job.id))
    records = [rt.jobs.get(j.id).usage for j in done]
    assert all(r.render_s > 0 and r.failed_render_s == 0 and r.attempts == 1
               for r in records)
    assert all(r.device == "cpu" and r.characters == len("Hello there.") and r.bytes > 0
               and r.audio_s > 0 for r in records)
    assert sum(r.render_s for r in records) == pytest.approx(
        counted("piper-joe") - before_ok, abs=1e-9)
    failed = rt.jobs.get(bad.id).usage
    assert failed.render_s > 0 and failed.failed_render_s == failed.render_s
    assert failed.render_s == pytest.approx(counted("test-silent") - before_bad, abs=1e-9)
