"""Replaying a delivery (``POST /v1/webhook_deliveries/{id}/replay``; the console's
button): back on the schedule, due now, then sent by the delivery task as any attempt,
with the same webhook-id and the secret current at that moment."""

from __future__ import annotations

import uuid

import pytest
from standardwebhooks import Webhook

from core.errors import Conflict
from core.jobs import JobKind
from storage.db import make_engine, make_sessionmaker
from storage.records import NewJob
from storage.repositories import KeyRepository
from tasks.deliver import lock_s
from tasks.runtime import WorkerRuntime

from . import test_delivery
from .receiver import Reply
from .test_delivery import completed_job, run_due

rt, receiver = test_delivery.rt, test_delivery.receiver  # the same fixtures


def _failed(rt: WorkerRuntime, receiver, path: str) -> tuple[str, str, int]:
    receiver.reply(path, Reply(500), Reply(500), Reply(500))
    tenant, job_id = completed_job(rt, receiver.url(path))
    assert [run_due(rt) for _ in range(3)] == [["retrying"], ["retrying"], ["failed"]]
    [log] = rt.webhooks.deliveries_for_job(tenant, job_id)
    return tenant, job_id, log.id


def test_a_failed_delivery_replayed_is_one_more_attempt_with_the_same_id(rt, receiver):
    tenant, job_id, delivery = _failed(rt, receiver, "/replay")
    rotated = rt.webhooks.rotate_default_secret(tenant).secret
    replayed = rt.webhooks.replay(tenant, delivery)
    assert replayed.status == "pending" and len(replayed.attempts) == 3
    assert run_due(rt) == ["succeeded"]
    [log] = rt.webhooks.deliveries_for_job(tenant, job_id)
    assert log.status == "succeeded" and [a.status_code for a in log.attempts] == [
        500, 500, 500, 200]
    sent = receiver.at("/replay")
    assert len({r.headers["webhook-id"] for r in sent}) == 1 and len(sent) == 4
    Webhook(rotated).verify(sent[-1].body, sent[-1].headers)  # the current secret signs it


def test_a_replay_that_fails_again_is_not_retried_past_its_schedule(rt, receiver):
    tenant, _job, delivery = _failed(rt, receiver, "/still-down")
    receiver.reply("/still-down", Reply(503))
    rt.webhooks.replay(tenant, delivery)
    assert run_due(rt) == ["failed"] and run_due(rt) == []


def test_another_tenant_cannot_replay_and_an_operator_scope_can(rt, receiver):
    tenant, _job, delivery = _failed(rt, receiver, "/scoped")
    assert rt.webhooks.replay("ten_someone_else", delivery) is None
    assert rt.webhooks.replay(tenant, 10**12) is None
    assert rt.webhooks.replay(None, delivery).status == "pending"  # every tenant's


def test_a_delivery_being_sent_is_not_replayed(rt, receiver):
    tenant, job_id = completed_job(rt, receiver.url("/busy"))
    [(delivery, _token)] = rt.webhooks.claim_due(lock_s(rt.settings))
    with pytest.raises(Conflict) as err:
        rt.webhooks.replay(tenant, delivery)
    assert err.value.code == "webhook_delivery_in_flight"


def test_a_disabled_endpoints_delivery_is_not_replayed(rt, receiver):
    """A 410 disabled the endpoint: a replay says so (409) until it is enabled again."""
    receiver.reply("/gone", Reply(410))
    tenant, _ = KeyRepository(make_sessionmaker(make_engine(rt.settings.db_url))).create_key(
        "t-" + uuid.uuid4().hex)
    endpoint, _secret = rt.webhooks.create_endpoint(tenant, name="e", url=receiver.url("/gone"),
                                                    event_types=["speech.completed"])
    job, _ = rt.jobs.create(NewJob(tenant_id=tenant, kind=JobKind.SPEECH, model="tts-1",
                                   pipeline="piper-joe", queue="q", request={}, metadata=None,
                                   max_attempts=1))
    rt.jobs.claim(job.id, "w", 60)
    assert rt.jobs.complete(job.id, 1, [], 3600)
    assert run_due(rt) == ["stopped"]
    [log] = rt.webhooks.recent_deliveries(tenant, endpoint.id)
    with pytest.raises(Conflict) as err:
        rt.webhooks.replay(tenant, log.id)
    assert err.value.code == "webhook_endpoint_disabled"
