"""Webhook rows on both backends: events staged inside the job transitions (outbox), the
delivery locks that keep one attempt in flight per target, 410s, and secrets."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from core.jobs import JobKind
from storage.db import make_engine, make_sessionmaker
from storage.records import AttemptRecord, JobRecord, JobWebhookRequest, NewJob
from storage.repositories import JobRepository, KeyRepository, WebhookRepository
from storage.repositories.webhooks import PENDING, STOPPED, SUCCEEDED, default_events

LOCK_S = 30.0


@dataclass
class Repos:
    jobs: JobRepository
    hooks: WebhookRepository
    keys: KeyRepository
    tenant: str

    def submit(self, kind: JobKind = JobKind.SPEECH, events: tuple[str, ...] | None = None,
               url: str | None = "https://hooks.example/job") -> JobRecord:
        hook = None if url is None else JobWebhookRequest(
            url, events or default_events(kind.value))
        job, _ = self.jobs.create(NewJob(
            tenant_id=self.tenant, kind=kind, model="m", pipeline="piper-joe", queue="q",
            request={"input": "hi"}, metadata=None, max_attempts=3, webhook=hook))
        return job

    def cancelled(self, count: int = 1, url: str | None = "https://hooks.example/job"
                  ) -> list[JobRecord]:
        jobs = [self.submit(url=url) for _ in range(count)]
        for job in jobs:
            self.jobs.cancel(job.id, self.tenant)
        return jobs

    def endpoint(self, *events: str):
        return self.hooks.create_endpoint(self.tenant, name="n", url="https://a.example",
                                          event_types=list(events))[0]

    def log(self, job_id: str):
        return self.hooks.deliveries_for_job(self.tenant, job_id)

    def claimed(self, ids) -> dict[int, str]:
        return {d: t for d, t in self.hooks.claim_due(LOCK_S, limit=10_000) if d in ids}


@pytest.fixture
def repos(db_url) -> Repos:
    sessions = make_sessionmaker(make_engine(db_url))
    keys = KeyRepository(sessions)
    tenant, _ = keys.create_key("t-" + uuid.uuid4().hex)
    return Repos(JobRepository(sessions), WebhookRepository(sessions), keys, tenant)


def _attempt(code: int | None = 200, next_at: datetime | None = None) -> AttemptRecord:
    return AttemptRecord(attempted_at=datetime.now(UTC), url_host="hooks.example",
                         status_code=code, error=None, duration_ms=3, next_attempt_at=next_at)


def test_complete_stages_one_event_for_each_interested_target(repos):
    endpoint, _ = repos.hooks.create_endpoint(repos.tenant, name="all", url="https://a.example",
                                              event_types=["speech.completed"])
    repos.hooks.create_endpoint(repos.tenant, name="video", url="https://b.example",
                                event_types=["video.completed"])
    job = repos.submit()
    claimed = repos.jobs.claim(job.id, "w", 60)
    assert repos.log(job.id) == []  # "started" was not asked for
    assert repos.jobs.complete(job.id, claimed.attempts, [], 3600)
    log = repos.log(job.id)
    assert len(log) == 2 and {d.event_type for d in log} == {"speech.completed"}
    assert len({d.event_id for d in log}) == 1
    assert {d.endpoint_id for d in log} == {None, endpoint.id}
    assert all(d.status == PENDING and d.attempts == () for d in log)


def test_a_transition_that_lost_its_race_stages_nothing(repos):
    repos.hooks.create_endpoint(repos.tenant, name="n", url="https://a.example",
                                event_types=["speech.completed", "speech.failed",
                                             "speech.cancelled"])
    job = repos.submit()
    claimed = repos.jobs.claim(job.id, "w", 60)
    assert not repos.jobs.complete(job.id, claimed.attempts + 1, [], 3600)
    assert not repos.jobs.fail(job.id, "x", "y", attempt=claimed.attempts + 1)
    assert repos.log(job.id) == []
    assert repos.jobs.fail(job.id, "boom", "it broke", attempt=claimed.attempts)
    repos.jobs.cancel(job.id, repos.tenant)  # already terminal: no change, no event
    assert [d.event_type for d in repos.log(job.id)] == ["speech.failed", "speech.failed"]


def test_started_only_when_asked_and_only_for_the_first_attempt(repos):
    job = repos.submit(JobKind.VIDEO, events=("video.started", "video.cancelled"))
    first = repos.jobs.claim(job.id, "w", 60)
    assert [d.event_type for d in repos.log(job.id)] == ["video.started"]
    repos.jobs.requeue(job.id, first.attempts, queue="q", delay_s=0, code="c", message="m")
    repos.jobs.claim(job.id, "w", 60)
    repos.jobs.cancel(job.id, repos.tenant)
    assert [d.event_type for d in repos.log(job.id)] == ["video.started", "video.cancelled"]


def test_cancel_of_a_queued_job_and_other_tenants_endpoints(repos):
    other, _ = repos.keys.create_key("o-" + uuid.uuid4().hex)
    repos.hooks.create_endpoint(other, name="other", url="https://o.example",
                                event_types=["speech.cancelled"])
    [job] = repos.cancelled()
    [delivery] = repos.log(job.id)
    assert delivery.event_type == "speech.cancelled" and delivery.endpoint_id is None


def test_one_delivery_in_flight_per_target_in_creation_order(repos):
    endpoint = repos.endpoint("speech.cancelled")
    jobs = repos.cancelled(3, url=None)
    ids = [repos.log(j.id)[0].id for j in jobs]
    assert ids == sorted(ids)
    claimed = repos.claimed(ids)
    assert list(claimed) == [ids[0]]  # the oldest, and only it
    assert repos.claimed(ids) == {}  # in flight: nothing more for this endpoint
    work = repos.hooks.start(ids[0], claimed[ids[0]], LOCK_S)
    assert work.endpoint_id == endpoint.id and work.url == "https://a.example"
    following = repos.hooks.finish(work, _attempt(200), SUCCEEDED, LOCK_S)
    assert [d for d, _ in following] == [ids[1]]  # handed on at once, already locked
    assert repos.claimed(ids) == {}
    assert repos.log(jobs[0].id)[0].status == SUCCEEDED


def test_one_tenants_backlog_does_not_starve_another_tenants_delivery(repos):
    """Tenant A: 402 due deliveries to one endpoint whose oldest is in flight (a slow
    receiver); tenant B: one. The scheduler's default batch must reach B's (the busy
    target's rows are skipped in SQL, not after a window of them was read)."""
    repos.endpoint("speech.cancelled")
    repos.cancelled(402, url=None)
    first = repos.hooks.claim_due(LOCK_S)
    assert first  # A's oldest (and whatever else was due) is now in flight
    tenant_b, _ = repos.keys.create_key("b-" + uuid.uuid4().hex)
    b = Repos(repos.jobs, repos.hooks, repos.keys, tenant_b)
    [job_b] = b.cancelled(1, url="https://b.example/hook")
    [b_delivery] = b.log(job_b.id)
    for _ in range(20):  # each round claims one per free target; B's comes soon
        claimed = [d for d, _ in repos.hooks.claim_due(LOCK_S)]
        if b_delivery.id in claimed:
            break
        assert claimed, "nothing left to claim, and B's delivery was never claimed"
    else:
        raise AssertionError("B's delivery was not claimed in 20 rounds")


def test_an_expired_lock_is_dispatched_again_and_the_stale_one_is_refused(repos):
    [job] = repos.cancelled()
    [delivery] = repos.log(job.id)
    [(first_id, stale)] = [(d, t) for d, t in repos.hooks.claim_due(0.2, 10_000)
                           if d == delivery.id]
    work = repos.hooks.start(first_id, stale, 0.2)  # this worker then dies mid-attempt
    assert work is not None
    time.sleep(0.3)
    fresh = repos.claimed([delivery.id])
    assert fresh and fresh[delivery.id] != stale
    assert repos.hooks.start(delivery.id, stale, LOCK_S) is None
    assert repos.hooks.finish(work, _attempt(200), SUCCEEDED, LOCK_S) is None
    redo = repos.hooks.start(delivery.id, fresh[delivery.id], LOCK_S)
    assert redo.event_id == work.event_id  # the same event: one webhook-id throughout
    assert repos.hooks.finish(redo, _attempt(200), SUCCEEDED, LOCK_S) == []
    [done] = repos.log(job.id)
    assert done.status == SUCCEEDED and len(done.attempts) == 1


def test_a_retry_waits_for_its_time(repos):
    [job] = repos.cancelled()
    [delivery] = repos.log(job.id)
    token = repos.claimed([delivery.id])[delivery.id]
    work = repos.hooks.start(delivery.id, token, LOCK_S)
    later = datetime.now(UTC) + timedelta(seconds=60)
    repos.hooks.finish(work, _attempt(500, later), PENDING, LOCK_S)
    assert repos.claimed([delivery.id]) == {}
    [logged] = repos.log(job.id)
    assert logged.status == PENDING and logged.attempts[0].status_code == 500
    assert abs((logged.next_attempt_at - later).total_seconds()) < 1


def test_410_from_an_endpoint_disables_it_until_it_is_updated(repos):
    endpoint = repos.endpoint("speech.cancelled")
    jobs = repos.cancelled(2, url=None)
    first = repos.log(jobs[0].id)[0].id
    work = repos.hooks.start(first, repos.claimed([first])[first], LOCK_S)
    assert repos.hooks.finish(work, _attempt(410), STOPPED, LOCK_S) == []
    assert [repos.log(j.id)[0].status for j in jobs] == [STOPPED, STOPPED]
    assert repos.hooks.get_endpoint(repos.tenant, endpoint.id).disabled_at is not None
    [later] = repos.cancelled(url=None)
    assert repos.log(later.id) == []  # a disabled endpoint gets no new events
    enabled = repos.hooks.update_endpoint(repos.tenant, endpoint.id, name="n")
    assert enabled.disabled_at is None


def test_410_from_a_job_url_stops_that_jobs_deliveries(repos):
    job = repos.submit(events=("speech.started", "speech.completed"))
    claimed = repos.jobs.claim(job.id, "w", 60)
    [started] = repos.log(job.id)
    work = repos.hooks.start(started.id, repos.claimed([started.id])[started.id], LOCK_S)
    repos.hooks.finish(work, _attempt(410), STOPPED, LOCK_S)
    repos.jobs.complete(job.id, claimed.attempts, [], 3600)
    assert [(d.event_type, d.status) for d in repos.log(job.id)] == [
        ("speech.started", STOPPED)]


def test_updating_an_endpoint_moves_updated_at_only_on_change(repos):
    endpoint, secret = repos.hooks.create_endpoint(
        repos.tenant, name="n", url="https://a.example", event_types=["video.completed"])
    assert endpoint.secret_hint == f"whsec_...{secret[-4:]}"
    same = repos.hooks.update_endpoint(repos.tenant, endpoint.id, name="n")
    assert same.updated_at == endpoint.updated_at
    changed = repos.hooks.update_endpoint(repos.tenant, endpoint.id, url="https://c.example")
    assert changed.url == "https://c.example" and changed.updated_at > endpoint.updated_at
    assert repos.hooks.update_endpoint("ten_other", endpoint.id, name="x") is None
    assert not repos.hooks.delete_endpoint("ten_other", endpoint.id)
    assert repos.hooks.delete_endpoint(repos.tenant, endpoint.id)
    assert repos.hooks.get_endpoint(repos.tenant, endpoint.id) is None


def test_endpoint_list_is_newest_first_with_a_cursor(repos):
    made = [repos.hooks.create_endpoint(repos.tenant, name=f"e{i}", url="https://a.example",
                                        event_types=["video.failed"])[0] for i in range(3)]
    page, more = repos.hooks.list_endpoints(repos.tenant, limit=2)
    assert [e.id for e in page] == [made[2].id, made[1].id] and more
    rest, more = repos.hooks.list_endpoints(repos.tenant, after=page[-1].id, limit=2)
    assert [e.id for e in rest] == [made[0].id] and not more


def test_secrets_rotate_with_and_without_the_grace_period(repos):
    first = repos.hooks.default_secret(repos.tenant)
    assert repos.hooks.default_secret(repos.tenant) == first
    rotated = repos.hooks.rotate_default_secret(repos.tenant)
    now = datetime.now(UTC)
    assert rotated.active(now) == (rotated.secret, first.secret)
    assert rotated.active(now + timedelta(hours=24, seconds=1)) == (rotated.secret,)
    endpoint, secret = repos.hooks.create_endpoint(
        repos.tenant, name="n", url="https://a.example", event_types=["video.failed"])
    _, kept = repos.hooks.rotate_endpoint_secret(repos.tenant, endpoint.id, keep_old=True)
    assert repos.hooks.secret_of(endpoint.id, repos.tenant).active(now) == (kept, secret)
    _, alone = repos.hooks.rotate_endpoint_secret(repos.tenant, endpoint.id, keep_old=False)
    assert repos.hooks.secret_of(endpoint.id, repos.tenant).active(now) == (alone,)
