"""The worker's claim and completion write the same rows on both backends, and on
PostgreSQL each is one statement (``storage/repositories/hotpath.py``): the job, its
attempt, the webhook event with a delivery per interested target, the tenant's
fair-share pass and the lane's clock, the outputs and the usage record."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from sqlalchemy import event, select

from core.jobs import JobStatus
from storage.models import JobUsage, LaneClock, TenantService, WebhookDelivery, WebhookEvent
from storage.records import JobWebhookRequest, OutputRecord
from storage.repositories import (
    WebhookRepository,
)
from storage.repositories.usage import settle

from . import test_jobs_repository
from .test_jobs_repository import TTL, Repos, outputs, repos_on

repos = test_jobs_repository.repos  # the same fixture (SQLite and PostgreSQL)


def submit_with_hooks(repos: Repos):
    """A job with its own webhook (every event) in a tenant with a registered endpoint
    for completions only, and the job's render message."""
    tenant = repos.new_tenant()
    endpoint, _ = WebhookRepository(repos.sessions).create_endpoint(
        tenant, name="e", url="https://hooks.example/x", event_types=["speech.completed"])
    new = replace(repos.new_job(tenant), pipeline="hot-" + uuid.uuid4().hex[:8],  # its own
                  webhook=JobWebhookRequest("https://own.example/cb",  # lane to claim in
                                            ("speech.started", "speech.completed")))
    job, msg = repos.jobs.create(new)
    return job, msg, endpoint.id


def events_of(repos: Repos, job_id: str) -> dict[str, list[tuple]]:
    with repos.sessions() as s:
        rows = s.execute(select(WebhookEvent.type, WebhookDelivery.endpoint_id,
                                WebhookDelivery.url, WebhookDelivery.target,
                                WebhookDelivery.status)
                         .join(WebhookDelivery, WebhookDelivery.event_id == WebhookEvent.id)
                         .where(WebhookEvent.job_id == job_id)).all()
    out: dict[str, list[tuple]] = {}
    for t, *delivery in rows:
        out.setdefault(t, []).append(tuple(delivery))
    return {t: sorted(d, key=str) for t, d in out.items()}


def usage_row(repos: Repos, job_id: str) -> dict:
    with repos.sessions() as s:
        u = s.get(JobUsage, job_id, populate_existing=True)
        return {a.key: getattr(u, a.key) for a in JobUsage.__mapper__.column_attrs}


def test_claim_and_complete_stage_the_events_for_each_target(repos: Repos):
    job, msg, endpoint = submit_with_hooks(repos)
    claimed = repos.jobs.claim_next(msg.token, "w1", 60)
    assert claimed is not None and claimed.id == job.id and claimed.attempts == 1
    assert claimed.status is JobStatus.RUNNING and claimed.outputs == ()
    assert events_of(repos, job.id) == {  # started: the job's own URL only
        "speech.started": [(None, "https://own.example/cb", job.id, "pending")]}
    assert repos.jobs.complete(job.id, 1, outputs(2), TTL, render=(0.5, "cpu"))
    assert events_of(repos, job.id)["speech.completed"] == sorted([
        (None, "https://own.example/cb", job.id, "pending"),
        (endpoint, None, endpoint, "pending")], key=str)
    done = repos.jobs.get(job.id)
    assert done.status is JobStatus.COMPLETED and done.progress == 100
    assert [o.key for o in done.outputs] == ["jobs/x/0.wav", "jobs/x/1.wav"]
    assert done.expires_at is not None and done.completed_at is not None
    [attempt] = repos.jobs.attempts(job.id)
    assert (attempt.outcome, attempt.render_s, attempt.device) == ("completed", 0.5, "cpu")
    # a second completion of the same attempt changes nothing
    assert not repos.jobs.complete(job.id, 1, outputs(1), TTL, render=(9.0, "cpu"))
    assert len(repos.jobs.get(job.id).outputs) == 2


def test_the_usage_record_is_what_settle_rebuilds(repos: Repos):
    """Two attempts (the first retried after 1.25 s on another device), a video's
    output with a preview beside it: the record the completion wrote equals the one
    ``usage.settle`` rebuilds from the stored attempts and outputs."""
    job = repos.submit()
    repos.jobs.claim(job.id, "w1", lease_s=60)
    repos.jobs.requeue(job.id, 1, queue="q", delay_s=0, code="timeout", message="slow",
                       render=(1.25, "cuda:1 (H200)"))
    repos.jobs.claim(job.id, "w2", lease_s=60)
    video = OutputRecord(index=0, key="j/a2/0.mp4", content_type="video/mp4", bytes=5000,
                         sha256="0" * 64, duration_s=2.0, sample_rate=48000, channels=1,
                         width=64, height=64, fps=24.0, frames=48)
    thumb = OutputRecord(index=0, key="j/a2/0.webp", content_type="image/webp", bytes=70,
                         sha256="1" * 64, width=64, height=64, variant="thumbnail")
    assert repos.jobs.complete(job.id, 2, [video, thumb], TTL, render=(0.75, None))
    written = usage_row(repos, job.id)
    with repos.sessions.begin() as s:
        settle(s, job.id, datetime.now(UTC))
    rebuilt = usage_row(repos, job.id)
    assert written == rebuilt
    assert (written["render_s"], written["failed_render_s"], written["attempts"]) == (
        2.0, 1.25, 2)
    assert written["device"] == "cuda:1 (H200)"  # the last attempt that named one
    assert (written["bytes"], written["frames"], written["video_s"]) == (5000, 48, 2.0)


def test_the_claim_charges_the_tenant_and_moves_the_lane_clock(repos: Repos):
    job, msg, _ = submit_with_hooks(repos)
    repos.jobs.claim_next(msg.token, "w", 60)
    with repos.sessions() as s:
        [pass_] = s.scalars(select(TenantService.pass_).where(
            TenantService.tenant_id == job.tenant_id, TenantService.pipeline == job.pipeline))
        clock = s.scalar(select(LaneClock.vtime).where(LaneClock.pipeline == job.pipeline,
                                                       LaneClock.lane == "interactive"))
    assert clock is not None and pass_ == clock + 1.0  # served at the clock, weight 1


@pytest.fixture
def pg_repos(pg_url: str) -> Iterator[Repos]:
    yield from repos_on(pg_url)


def test_on_postgresql_each_is_one_statement(pg_repos: Repos):
    """The claim: the lane's lock, then one statement; the completion: one statement.
    (Statement by statement they were 8 and 11.)"""
    repos = pg_repos
    job, msg, _ = submit_with_hooks(repos)
    seen: list[str] = []
    engine = repos.sessions.kw["bind"]
    listener = lambda *a: seen.append(a[2])  # noqa: E731
    event.listen(engine, "before_cursor_execute", listener)
    try:
        assert repos.jobs.claim_next(msg.token, "w", 60) is not None
        claim, seen[:] = list(seen), []
        assert repos.jobs.complete(job.id, 1, outputs(1), TTL, render=(0.1, "cpu"))
        complete = list(seen)
    finally:
        event.remove(engine, "before_cursor_execute", listener)
    assert len(claim) == 2 and claim[0].startswith("INSERT INTO lane_clocks")
    assert len(complete) == 1 and complete[0].startswith("WITH done AS")
    assert events_of(repos, job.id).keys() == {"speech.started", "speech.completed"}
