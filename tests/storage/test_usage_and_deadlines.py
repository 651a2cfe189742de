"""Usage records and deadlines in the job repository, on both backends: the record is
written by the transition that ends the job, from its attempts' own times; failed
attempts' time is kept apart; sums per bucket, group and batch; the start deadline
expires a queued job (never one that has started) and a late claim; the caller's
maximum run time ends the job ``cancelled`` with ``deadline_exceeded``."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from sqlalchemy import select

from core.jobs import JobStatus
from storage.models import WebhookEvent
from storage.records import OutputRecord
from storage.repositories import WebhookRepository
from storage.repositories.usage import UsageRepository

from . import test_jobs_repository
from .test_jobs_repository import TTL, Repos, outputs

repos = test_jobs_repository.repos  # the same fixture

CPU = "cpu"


def video_outputs() -> list[OutputRecord]:
    return [OutputRecord(index=0, key="jobs/v/0.mp4", content_type="video/mp4", bytes=5000,
                         sha256="0" * 64, duration_s=2.0, sample_rate=48000, channels=1,
                         width=64, height=64, fps=24.0, frames=48)]


def test_a_completed_job_records_every_attempt_and_keeps_the_failed_part_apart(repos: Repos):
    job = repos.submit()
    repos.jobs.claim(job.id, "w1", lease_s=60)
    assert repos.jobs.requeue(job.id, 1, queue="q", delay_s=0, code="timeout",
                              message="slow", render=(1.25, CPU))
    repos.jobs.claim(job.id, "w2", lease_s=60)
    assert repos.jobs.complete(job.id, 2, outputs(2), TTL, render=(0.5, "cuda:0 (H200)"))
    usage = repos.jobs.get(job.id).usage
    assert (usage.render_s, usage.failed_render_s, usage.attempts) == (1.75, 1.25, 2)
    assert usage.device == "cuda:0 (H200)"  # the attempt that produced the output
    assert (usage.characters, usage.audio_s, usage.video_s, usage.frames, usage.bytes) == (
        len("hello"), 3.0, 0.0, 0, 2001)
    assert [a.render_s for a in repos.jobs.attempts(job.id)] == [1.25, 0.5]


def test_a_failed_job_bills_nothing_and_a_cancelled_attempt_reports_its_time_later(
        repos: Repos):
    failed, cancelled = repos.submit(), repos.submit()
    repos.jobs.claim(failed.id, "w", lease_s=60)
    assert repos.jobs.fail(failed.id, "output_invalid", "silent", attempt=1, render=(2.0, CPU))
    f = repos.jobs.get(failed.id).usage
    assert (f.render_s, f.failed_render_s, f.bytes) == (2.0, 2.0, 0)
    repos.jobs.claim(cancelled.id, "w", lease_s=60)
    repos.jobs.cancel(cancelled.id, cancelled.tenant_id)
    assert repos.jobs.get(cancelled.id).usage.render_s == 0.0  # the worker has not said yet
    assert repos.jobs.record_render(cancelled.id, 1, 0.75, CPU)
    assert not repos.jobs.record_render(cancelled.id, 1, 9.0, CPU)  # written once
    c = repos.jobs.get(cancelled.id).usage
    assert (c.render_s, c.failed_render_s) == (0.75, 0.75)


def test_sums_per_bucket_group_and_batch_equal_the_jobs_records(repos: Repos):
    tenant = repos.new_tenant()
    usage = UsageRepository(repos.sessions)
    start = int(datetime.now(UTC).timestamp()) // 3600 * 3600
    records = []
    for i in range(5):
        job = repos.submit(tenant)
        repos.jobs.claim(job.id, "w", lease_s=60)
        assert repos.jobs.complete(job.id, 1, outputs(1), TTL, render=(0.1 * (i + 1), CPU))
        records.append(repos.jobs.get(job.id).usage)
    [row] = usage.buckets(tenant, start, start + 3600, 3600)
    assert row.start == start and row.group == {}
    assert row.usage.jobs == row.usage.completed == 5
    assert abs(row.usage.render_s - sum(r.render_s for r in records)) < 1e-9
    assert row.usage.bytes == sum(r.bytes for r in records) == 5 * 1000
    [by_model] = usage.buckets(tenant, start, start + 3600, 3600, ("model", "pipeline"))
    assert by_model.group == {"model": "piper-joe", "pipeline": "piper-joe"}
    assert usage.buckets(tenant, start + 3600, start + 7200, 3600) == []
    assert usage.buckets(repos.new_tenant(), start, start + 3600, 3600) == []


def test_the_start_deadline_expires_queued_jobs_that_never_started(repos: Repos):
    past = datetime.now(UTC) - timedelta(seconds=1)
    late, _ = repos.jobs.create(replace(repos.new_job(), start_by=past))
    retried, _ = repos.jobs.create(replace(repos.new_job(), start_by=past))
    repos.jobs.claim(retried.id, "w", lease_s=60)
    repos.jobs.requeue(retried.id, 1, queue="q", delay_s=0, code="timeout", message="x",
                       render=(0.5, CPU))
    future, _ = repos.jobs.create(replace(repos.new_job(),
                                          start_by=past + timedelta(hours=1)))
    expired = repos.jobs.expire_queued(limit=100_000)
    assert late.id in expired and retried.id not in expired and future.id not in expired
    job = repos.jobs.get(late.id)
    assert (job.status, job.error_code, job.attempts) == (
        JobStatus.EXPIRED, "start_deadline_exceeded", 0)
    assert repos.jobs.claim(late.id, "w", lease_s=60) is None  # its message finds nothing
    assert repos.jobs.get(retried.id).status is JobStatus.QUEUED  # it had started


def test_a_late_claim_expires_and_withdraws_its_started_event(repos: Repos):
    hooks = WebhookRepository(repos.sessions)
    hooks.create_endpoint(repos.tenant, name="all", url="https://example.com/hook",
                          event_types=["speech.started", "speech.failed"])
    job, _ = repos.jobs.create(replace(repos.new_job(),
                                       start_by=datetime.now(UTC) - timedelta(seconds=1)))
    claimed = repos.jobs.claim(job.id, "w", lease_s=60)
    assert claimed.start_by is not None and claimed.start_by < datetime.now(UTC)
    assert repos.jobs.expire_claimed(job.id, 1, "claimed after its start deadline")
    ended = repos.jobs.get(job.id)
    assert ended.status is JobStatus.EXPIRED and ended.error_code == "start_deadline_exceeded"
    with repos.sessions() as s:
        types = s.scalars(select(WebhookEvent.type).where(WebhookEvent.job_id == job.id)).all()
    assert types == ["speech.failed"]
    assert [a.outcome for a in repos.jobs.attempts(job.id)] == ["expired"]


def test_a_run_past_max_run_s_is_cancelled_with_deadline_exceeded(repos: Repos):
    job, _ = repos.jobs.create(replace(repos.new_job(), max_run_s=2.5))
    claimed = repos.jobs.claim(job.id, "w", lease_s=60)
    assert claimed.max_run_s == 2.5
    assert repos.jobs.cancel_overdue(job.id, 1, "past max_run_s", render=(2.5, CPU))
    assert not repos.jobs.cancel_overdue(job.id, 1, "again", render=(2.5, CPU))
    ended = repos.jobs.get(job.id)
    assert (ended.status, ended.error_code) == (JobStatus.CANCELLED, "deadline_exceeded")
    assert (ended.usage.render_s, ended.usage.failed_render_s) == (2.5, 2.5)


def test_a_job_cancelled_before_it_ran_has_no_usage_and_is_not_counted(repos: Repos):
    """Usage counts the jobs that ran: one cancelled while queued has `usage` null (as
    docs/deadlines-and-usage.md says) and is not among the tenant's jobs in /v1/usage."""
    tenant = repos.new_tenant()
    start = int(datetime.now(UTC).timestamp()) // 3600 * 3600
    never = repos.submit(tenant)
    repos.jobs.cancel(never.id, tenant)
    ran = repos.submit(tenant)
    repos.jobs.claim(ran.id, "w", lease_s=60)
    repos.jobs.cancel(ran.id, tenant)
    assert repos.jobs.get(never.id).usage is None
    assert repos.jobs.get(ran.id).usage is not None
    [row] = UsageRepository(repos.sessions).buckets(tenant, start, start + 3600, 3600)
    assert (row.usage.jobs, row.usage.attempts) == (1, 1)
