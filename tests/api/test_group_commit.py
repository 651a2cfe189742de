"""Group commit (api/submitter.py): submits that arrive together are written in one
transaction and published in one broker round trip, and each caller still hears only
about its own job, committed with its message."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
import uuid

import pytest
from sqlalchemy import event

from api.submitter import Submitter
from core.errors import InvalidRequest, ServiceUnavailable, TooManyRequests
from core.jobs import JobStatus
from pipelines import get_spec
from storage.db import make_engine, make_sessionmaker
from storage.records import JobWebhookRequest, NewJob
from storage.repositories import JobRepository, KeyRepository, OutboxRepository
from storage.repositories.quotas import INTERACTIVE, Quota, Quotas

DEADLINE_S = 30.0  # a generous bound on anything this module waits for


@pytest.fixture
def tenant(api_db) -> str:
    engine = make_engine(api_db)
    try:
        return KeyRepository(make_sessionmaker(engine)).create_key(
            "group-" + uuid.uuid4().hex[:8])[0]
    finally:
        engine.dispose()


def new_job(tenant: str, text: str) -> NewJob:
    spec = get_spec("piper-joe")
    return NewJob(tenant_id=tenant, kind=spec.kind, model="tts-1", pipeline=spec.name,
                  queue=spec.queue, request={"input": text}, metadata={"text": text},
                  max_attempts=3)


class Recorder:
    """The broker side: records each round trip (a list of messages), or fails."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[list] = []
        self.fail = fail

    def __call__(self, msgs) -> None:
        if self.fail:
            raise ServiceUnavailable("broker unavailable: ConnectionError")
        self.calls.append(list(msgs))


def services(api, publish_many: Recorder, jobs: JobRepository | None = None):
    return dataclasses.replace(api.services, publish_many=publish_many,
                               jobs=jobs or api.services.jobs)


def submit_all(submitter: Submitter, svc, news: list[NewJob]) -> list:
    async def run() -> list:
        return await asyncio.gather(*(submitter.submit(svc, n) for n in news),
                                    return_exceptions=True)
    return asyncio.run(run())


def test_concurrent_submits_share_transactions_and_round_trips(api, api_db, tenant):
    """Submits that arrive together share a transaction and a publish, and each caller is
    answered only once its job is committed: while the group's write (one statement on
    its own, committed when it returns) is held, no answer leaves, and the job an answer
    names is visible from another connection the moment the answer arrives."""
    broker = Recorder()
    svc = services(api, broker)
    groups: list[int] = []
    create_many = svc.jobs.create_many
    submitter = Submitter()
    news = [new_job(tenant, f"line {i}") for i in range(30)]
    other = JobRepository(make_sessionmaker(make_engine(api_db)))  # another connection
    visible: list[bool] = []
    committing, go = threading.Event(), threading.Event()

    def counting(batch):
        groups.append(len(batch))
        return create_many(batch)

    def hold_write(_conn, _cursor, statement, *_) -> None:  # the group's insert waits,
        if "INSERT INTO jobs" in statement:  # once done, until the test says go
            committing.set()
            go.wait(DEADLINE_S)

    async def answered(new):
        job = await submitter.submit(svc, new)
        visible.append(other.get(job.id) is not None)
        return job

    async def run():
        tasks = [asyncio.ensure_future(answered(n)) for n in news]
        deadline = asyncio.get_running_loop().time() + DEADLINE_S
        while not committing.is_set() and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        for _ in range(50):  # let whatever is ready run
            await asyncio.sleep(0)
        early = sum(t.done() for t in tasks)
        go.set()
        return early, await asyncio.gather(*tasks)

    svc = dataclasses.replace(svc, jobs=_Counting(svc.jobs, counting))
    engine = api.app.state.engine
    event.listen(engine, "after_cursor_execute", hold_write)
    try:
        early, jobs = asyncio.run(run())
    finally:
        go.set()
        event.remove(engine, "after_cursor_execute", hold_write)
    submitter.flush()
    assert committing.is_set() and early == 0  # no answer before its group is written
    assert visible == [True] * 30  # each answer names a committed job
    assert [j.metadata["text"] for j in jobs] == [f"line {i}" for i in range(30)]
    assert sum(groups) == 30 and len(groups) < 30  # later submits joined a group
    assert 1 <= len(broker.calls) <= len(groups)  # groups published together, after
    assert sorted(m.job_id for call in broker.calls for m in call) == sorted(j.id for j in jobs)
    outbox = OutboxRepository(make_sessionmaker(api.app.state.engine))
    for job in jobs:
        assert api.services.jobs.get(job.id).status is JobStatus.QUEUED
        [msg] = outbox.for_job(job.id)
        assert msg.token == job.dispatch_token
    assert not [m for m in outbox.due(grace_s=0, limit=1000) if m.job_id in
                {j.id for j in jobs}]  # all marked published (after the 202s, in the back)


def test_a_publish_that_hangs_holds_no_caller(api, tenant):
    """A broker that takes a publish and never answers (frozen) delays no 202: callers
    are answered once their group is committed, and the publish (and the marking) happen
    after, in the background; the messages meanwhile wait in the outbox."""
    release = threading.Event()
    broker = Recorder()

    def hanging(msgs) -> None:
        release.wait(DEADLINE_S)
        broker(msgs)

    svc = services(api, hanging)
    submitter = Submitter()
    answers: list = []
    writer = threading.Thread(target=lambda: answers.append(submit_all(
        submitter, svc, [new_job(tenant, f"h{i}") for i in range(5)])), daemon=True)
    writer.start()
    writer.join(DEADLINE_S)
    try:
        assert answers, "no caller was answered while the publish hung"
        due = {m.job_id for m in OutboxRepository(make_sessionmaker(
            api.app.state.engine)).due(grace_s=0, limit=1000)}
        assert {j.id for j in answers[0]} <= due  # committed, not yet published
    finally:
        release.set()
    submitter.flush()
    assert sorted(m.job_id for call in broker.calls for m in call) == sorted(
        j.id for j in answers[0])
    due = {m.job_id for m in OutboxRepository(make_sessionmaker(
        api.app.state.engine)).due(grace_s=0, limit=1000)}
    assert not {j.id for j in answers[0]} & due  # published, then marked


def test_submits_one_after_another_are_marked_published_together(api, tenant,
                                                                 monkeypatch):
    """A trickle of submits (each its own group, each published at once) is marked
    published in one UPDATE, MARK_DELAY_S after the first went out, not in a
    transaction of its own per submit; shutting down marks what is pending."""
    from api import submitter as module

    marks: list[list[int]] = []
    outbox = api.services.outbox
    svc = dataclasses.replace(services(api, Recorder()), outbox=_Marks(outbox, marks))
    submitter = Submitter()
    [first] = submit_all(submitter, svc, [new_job(tenant, "alone")])
    deadline = time.monotonic() + DEADLINE_S
    while not marks and time.monotonic() < deadline:  # marked on its own, after the delay
        time.sleep(0.05)
    assert marks == [[m.id for m in outbox.for_job(first.id)]]
    monkeypatch.setattr(module, "MARK_DELAY_S", DEADLINE_S)  # the rest: only at shutdown
    jobs = [submit_all(submitter, svc, [new_job(tenant, f"t{i}")])[0] for i in range(4)]
    submitter.flush()
    assert len(marks) == 2, marks  # four publishes, one marking statement
    assert sorted(marks[1]) == sorted(m.id for j in jobs for m in outbox.for_job(j.id))
    due = {m.job_id for m in outbox.due(grace_s=0, limit=1000)}
    assert not {j.id for j in [first, *jobs]} & due


class _Marks:
    """The outbox repository with each ``mark_published`` call recorded."""

    def __init__(self, outbox: OutboxRepository, marks: list) -> None:
        self._outbox, self._marks = outbox, marks

    def mark_published(self, ids: list[int]) -> None:
        self._marks.append(list(ids))
        self._outbox.mark_published(ids)

    def __getattr__(self, name: str):
        return getattr(self._outbox, name)


class _Counting:
    """The app's job repository with ``create_many`` observed."""

    def __init__(self, jobs: JobRepository, create_many) -> None:
        self._jobs, self.create_many = jobs, create_many

    def __getattr__(self, name: str):
        return getattr(self._jobs, name)


def test_a_quota_refusal_in_a_group_refuses_only_the_jobs_over_it(api, tenant):
    quotas = Quotas({INTERACTIVE: Quota(max_active_per_tenant=3,
                                        max_queued_per_pipeline=1_000_000)})
    jobs_repo = JobRepository(make_sessionmaker(api.app.state.engine), quotas)
    svc = services(api, Recorder(), jobs_repo)
    results = submit_all(Submitter(), svc, [new_job(tenant, f"q{i}") for i in range(5)])
    accepted = [r for r in results if not isinstance(r, Exception)]
    refused = [r for r in results if isinstance(r, TooManyRequests)]
    assert len(accepted) == 3 and len(refused) == 2
    assert {r.code for r in refused} == {"too_many_active_jobs"}
    assert len(jobs_repo.list(tenant, limit=100)[0]) == 3


def test_a_broker_outage_leaves_committed_jobs_to_the_relay(api, tenant):
    svc = services(api, Recorder(fail=True))
    jobs = submit_all(Submitter(), svc, [new_job(tenant, f"b{i}") for i in range(4)])
    due = {m.job_id for m in OutboxRepository(make_sessionmaker(api.app.state.engine)).due(
        grace_s=0, limit=1000)}
    for job in jobs:
        assert api.services.jobs.get(job.id).status is JobStatus.QUEUED
        assert job.id in due  # unpublished: the relay sends it


def test_a_database_outage_fails_every_caller_of_the_group(api, tenant):
    down = make_engine("postgresql://postgres@127.0.0.1:9/nothing")
    svc = services(api, Recorder(), JobRepository(make_sessionmaker(down)))
    results = submit_all(Submitter(), svc, [new_job(tenant, f"d{i}") for i in range(3)])
    assert all(isinstance(r, ServiceUnavailable) for r in results)
    down.dispose()


def bad_row(tenant: str, text: str) -> NewJob:
    """A row the database refuses (a NUL in a text column) that the schema would have
    caught: the group write must not take its neighbours down with it."""
    return dataclasses.replace(new_job(tenant, text), webhook=JobWebhookRequest(
        url="http://93.184.216.34/a\x00", event_types=("speech.completed",)))


def test_a_data_error_in_a_group_fails_only_its_own_row(api, tenant):
    news = [new_job(tenant, f"g{i}") for i in range(10)]
    news[6] = bad_row(tenant, "g6")
    results = api.services.jobs.create_many(news)
    assert isinstance(results[6], InvalidRequest) and results[6].http_status == 400
    ok = [r for i, r in enumerate(results) if i != 6]
    assert all(isinstance(r, tuple) for r in ok), results
    assert [job.metadata["text"] for job, _ in ok] == [f"g{i}" for i in range(10) if i != 6]
    stored = {j.metadata["text"] for j in api.services.jobs.list(tenant, limit=100)[0]}
    assert {f"g{i}" for i in range(10) if i != 6} <= stored and "g6" not in stored
    outbox = OutboxRepository(make_sessionmaker(api.app.state.engine))
    assert all(len(outbox.for_job(job.id)) == 1 for job, _ in ok)


def test_a_data_error_in_a_group_answers_only_its_caller(api, tenant):
    broker = Recorder()
    svc = services(api, broker)
    news = [new_job(tenant, f"s{i}") for i in range(10)]
    news[4] = bad_row(tenant, "s4")
    submitter = Submitter()
    results = submit_all(submitter, svc, news)
    submitter.flush()  # the group's messages are published after its callers are answered
    assert isinstance(results[4], InvalidRequest)
    assert [r.metadata["text"] for i, r in enumerate(results) if i != 4] == [
        f"s{i}" for i in range(10) if i != 4]
    published = {m.job_id for call in broker.calls for m in call}
    assert published == {r.id for i, r in enumerate(results) if i != 4}
