"""The fair claim on both backends: a render message wakes its lane, the lane serves the
tenant with the least service, and every queued job keeps exactly one message."""

from __future__ import annotations

import uuid

import pytest

from core.jobs import JobStatus
from storage.records import NewJob
from storage.repositories.shares import ShareRepository

from .test_jobs_repository import Repos, repos  # noqa: F401  (fixture)


@pytest.fixture
def pipeline() -> str:
    """A pipeline of its own: the PostgreSQL database is shared by the session."""
    return "fair-" + uuid.uuid4().hex[:8]


def queue(repos: Repos, tenant: str, pipeline: str, n: int) -> list[tuple[str, str]]:  # noqa: F811
    """n jobs for ``tenant``; their (job id, token) messages, in order."""
    sent = []
    for _ in range(n):
        job, msg = repos.jobs.create(NewJob(
            tenant_id=tenant, kind=repos.submit().kind, model="m", pipeline=pipeline,
            queue="q", request={"input": "x"}, metadata=None, max_attempts=3))
        sent.append((job.id, msg.token))
    return sent


def drain(repos: Repos, messages: list[tuple[str, str]]) -> list[str]:  # noqa: F811
    """Deliver each message once, in order; the tenants of the jobs claimed, in order.
    Each claimed job is completed at once, as a worker would."""
    served = []
    for _, token in messages:
        job = repos.jobs.claim_next(token, "w", 60)
        assert job is not None, "a message claimed nothing while jobs waited"
        assert repos.jobs.complete(job.id, job.attempts, [], 60)
        served.append(job.tenant_id)
    return served


def test_a_late_small_tenant_is_served_at_once(repos, pipeline):  # noqa: F811
    a, b = repos.new_tenant(), repos.new_tenant()
    messages = queue(repos, a, pipeline, 30) + queue(repos, b, pipeline, 3)
    served = drain(repos, messages)
    assert served.count(b) == 3 and max(i for i, t in enumerate(served) if t == b) < 6
    # Every message claimed exactly one job: none left queued, none skipped.
    assert all(repos.jobs.get(j).status is JobStatus.COMPLETED for j, _ in messages)


def test_weights_split_the_service(repos, pipeline):  # noqa: F811
    a, b = repos.new_tenant(), repos.new_tenant()
    ShareRepository(repos.sessions).set_weight(a, 3)
    messages = queue(repos, a, pipeline, 60) + queue(repos, b, pipeline, 60)
    first = drain(repos, messages)[:40]
    assert (first.count(a), first.count(b)) == (30, 10)


def test_a_used_message_or_a_superseded_one_claims_nothing(repos, pipeline):  # noqa: F811
    a = repos.new_tenant()
    (job_id, token), = queue(repos, a, pipeline, 1)
    claimed = repos.jobs.claim_next(token, "w", 60)
    assert claimed.id == job_id and claimed.attempts == 1
    assert repos.jobs.claim_next(token, "w", 60) is None  # a duplicate delivery
    assert repos.jobs.claim_next("not-a-token", "w", 60) is None


def test_the_holder_takes_over_the_claimed_jobs_token(repos, pipeline):  # noqa: F811
    a, b = repos.new_tenant(), repos.new_tenant()
    a_msgs = queue(repos, a, pipeline, 2)
    b_msgs = queue(repos, b, pipeline, 1)
    repos.jobs.claim_next(a_msgs[0][1], "w", 60)  # a's first job
    # b has had no service: a's second message claims b's job; a's second job now holds
    # b's token, whose message is still on its way.
    claimed = repos.jobs.claim_next(a_msgs[1][1], "w", 60)
    assert claimed.id == b_msgs[0][0]
    assert repos.jobs.get(a_msgs[1][0]).dispatch_token == b_msgs[0][1]
    assert repos.jobs.claim_next(b_msgs[0][1], "w", 60).id == a_msgs[1][0]


def test_a_retry_waits_out_its_backoff(repos, pipeline):  # noqa: F811
    a = repos.new_tenant()
    (job_id, token), = queue(repos, a, pipeline, 1)
    job = repos.jobs.claim_next(token, "w", 60)
    msg = repos.jobs.requeue(job.id, job.attempts, queue="q", delay_s=3600, code="x",
                             message="retry later")
    assert repos.jobs.claim_next(msg.token, "w", 60) is None  # not before its time
    assert repos.jobs.get(job_id).status is JobStatus.QUEUED
    claimed = repos.jobs.claim(job_id, "w", 60)
    back = repos.jobs.hand_back(job_id, claimed.attempts, queue="q")
    assert repos.jobs.claim_next(back.token, "w", 60).id == job_id


def test_a_tenant_whose_oldest_job_waits_out_a_backoff_is_served_its_next_ready_one(
        repos, pipeline):  # noqa: F811
    """The claim looks past a tenant's oldest queued job while that one is in its retry
    backoff: the tenant is still the fairest, and its newer ready job goes next."""
    a, b = repos.new_tenant(), repos.new_tenant()
    (a1, token), = queue(repos, a, pipeline, 1)
    job = repos.jobs.claim_next(token, "w", 60)
    repos.jobs.requeue(job.id, job.attempts, queue="q", delay_s=3600, code="x",
                       message="retry later")  # a: pass 1, its oldest job waits an hour
    assert drain(repos, queue(repos, b, pipeline, 2)) == [b, b]  # b: pass 2
    (a2, _), = queue(repos, a, pipeline, 1)
    (_, token), = queue(repos, b, pipeline, 1)
    claimed = repos.jobs.claim_next(token, "w", 60)
    assert (claimed.tenant_id, claimed.id) == (a, a2)
    assert repos.jobs.get(a1).status is JobStatus.QUEUED


def test_a_tenant_with_nothing_ready_is_passed_over_not_picked_and_fallen_back_from(
        repos, pipeline):  # noqa: F811
    """A heavy tenant (weight 10) whose only job waits out a retry backoff has the lowest
    key in the lane, but nothing to claim: it must not be the pick. Were it picked, the
    claim would fall back to the lane's oldest ready job and serve that job's tenant over
    and over (B C B B C C), not in turn (B C B C B C)."""
    a, b, c = repos.new_tenant(), repos.new_tenant(), repos.new_tenant()
    ShareRepository(repos.sessions).set_weight(a, 10)
    (_, token), = queue(repos, a, pipeline, 1)
    job = repos.jobs.claim_next(token, "w", 60)
    repos.jobs.requeue(job.id, job.attempts, queue="q", delay_s=3600, code="x",
                       message="retry later")  # a: served once, a tenth of a pass
    messages = queue(repos, b, pipeline, 3) + queue(repos, c, pipeline, 3)
    assert drain(repos, messages) == [b, c, b, c, b, c]
