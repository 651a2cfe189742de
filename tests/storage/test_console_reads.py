"""What the console reads, on both backends: each job's attempts (written in the
transitions' own transactions), job lists by every filter or every tenant, the queue and
outcome counts, and console sessions (usage: test_usage_and_deadlines.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from core.jobs import JobKind, JobStatus
from storage.records import JobFilter
from storage.repositories.activity import ActivityRepository
from storage.repositories.sessions import SessionRepository

from . import test_jobs_repository
from .test_jobs_repository import TTL, Repos, outputs

repos = test_jobs_repository.repos  # the same fixture


def test_each_attempt_is_recorded_with_its_worker_and_how_it_ended(repos: Repos) -> None:
    job = repos.submit()
    first = repos.jobs.claim(job.id, "worker-a", lease_s=60)
    assert repos.jobs.requeue(job.id, first.attempts, queue="q", delay_s=0,
                              code="lease_expired", message="the worker stopped answering")
    second = repos.jobs.claim(job.id, "worker-b", lease_s=60)
    assert repos.jobs.complete(job.id, second.attempts, outputs(1), TTL)
    attempts = repos.jobs.attempts(job.id)
    assert [(a.attempt, a.worker_id, a.outcome, a.error_code) for a in attempts] == [
        (1, "worker-a", "retried", "lease_expired"), (2, "worker-b", "completed", None)]
    assert attempts[0].error_message == "the worker stopped answering"
    assert all(a.ended_at >= a.claimed_at for a in attempts)


def test_a_failure_and_a_cancel_close_the_open_attempt(repos: Repos) -> None:
    failed, cancelled = repos.submit(), repos.submit()
    repos.jobs.claim(failed.id, "w", lease_s=60)
    assert repos.jobs.fail(failed.id, "output_invalid", "silence", attempt=1)
    repos.jobs.claim(cancelled.id, "w", lease_s=60)
    repos.jobs.cancel(cancelled.id, cancelled.tenant_id)
    assert [(a.outcome, a.error_code) for a in repos.jobs.attempts(failed.id)] == [
        ("failed", "output_invalid")]
    assert [a.outcome for a in repos.jobs.attempts(cancelled.id)] == ["cancelled"]
    assert repos.jobs.attempts(repos.submit().id) == []  # never claimed: no attempt


def test_a_lost_race_records_no_attempt(repos: Repos) -> None:
    job = repos.submit()
    assert repos.jobs.claim(job.id, "w1", lease_s=60) is not None
    assert repos.jobs.claim(job.id, "w2", lease_s=60) is None
    assert not repos.jobs.fail(job.id, "x", "late", attempt=7)
    assert [(a.worker_id, a.outcome) for a in repos.jobs.attempts(job.id)] == [("w1", None)]


def test_find_filters_and_every_tenant(repos: Repos) -> None:
    other = repos.new_tenant()
    mine, theirs = repos.submit(), repos.submit(other)
    video = repos.submit(kind=JobKind.VIDEO)
    ids = {j.id for j in repos.jobs.find(JobFilter(None), limit=100_000)[0]}
    assert {mine.id, theirs.id, video.id} <= ids
    own = repos.jobs.find(JobFilter(repos.tenant), limit=100)[0]
    assert theirs.id not in {j.id for j in own}
    videos = repos.jobs.find(JobFilter(repos.tenant, kind=JobKind.VIDEO))[0]
    assert [j.id for j in videos] == [video.id]
    later = datetime.now(UTC) + timedelta(minutes=1)
    assert repos.jobs.find(JobFilter(repos.tenant, created_after=later))[0] == []
    assert repos.jobs.find(JobFilter(repos.tenant, model="nothing-else"))[0] == []
    assert repos.jobs.find(JobFilter(repos.tenant, status=JobStatus.RUNNING))[0] == []
    page, more = repos.jobs.find(JobFilter(None), limit=1)
    assert more and repos.jobs.find(JobFilter(None), after=page[0].id, limit=1)[0][0] != page[0]


def test_queue_and_outcome_counts_are_the_jobs_own(repos: Repos) -> None:
    tenant = repos.new_tenant()
    queued = [repos.submit(tenant) for _ in range(3)]
    running = repos.jobs.claim(queued[0].id, "w", lease_s=60)
    done = repos.submit(tenant)
    repos.jobs.claim(done.id, "w", lease_s=60)
    repos.jobs.complete(done.id, 1, outputs(2), TTL)
    bad = repos.submit(tenant)
    repos.jobs.claim(bad.id, "w", lease_s=60)
    repos.jobs.fail(bad.id, "output_invalid", "silent", attempt=1)
    activity = ActivityRepository(repos.sessions)
    [row] = activity.queues(tenant)
    assert (row.pipeline, row.lane, row.queued, row.running) == ("piper-joe", "interactive", 2, 1)
    assert row.oldest_queued_at == min(j.created_at for j in queued[1:])
    assert running is not None
    outcomes = {(o.status, o.reason): o for o in activity.outcomes(tenant, 3600, 600)}
    assert outcomes[("completed", None)].count == 1
    assert outcomes[("failed", "output_invalid")].count == 1
    assert sum(outcomes[("completed", None)].buckets) == 1
    assert len(outcomes[("completed", None)].buckets) == 6


def test_sessions_open_check_and_close(repos: Repos) -> None:
    sessions = SessionRepository(repos.sessions)
    _, key = repos.keys.create_key("console-" + repos.tenant, operator=True)
    assert sessions.open("oj-wrong", 60) is None
    token, session = sessions.open(key, 60)
    assert session.operator and key not in token
    assert sessions.check(token, 60).csrf == session.csrf
    assert sessions.check(token + "x", 60) is None
    sessions.close(token)
    assert sessions.check(token, 60) is None
