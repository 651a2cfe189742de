"""Recovery paths of the worker: each test fails if its mechanism is removed."""

from __future__ import annotations

import threading
import time

import pytest

from core.errors import ServiceUnavailable
from core.jobs import JobStatus
from pipelines import RunContext, SpeechRequest
from pipelines.audex import AudexTTS
from tasks import render as render_module
from tasks.recovery import reclaim
from tasks.render import run_job
from tests import fake_pipelines

from .test_render import app, outcome, rt, submit, tenant  # noqa: F401  (fixtures)


def test_render_task_retries_then_fails_the_job_with_a_reason(rt, app, tenant,  # noqa: F811
                                                              monkeypatch):
    job = submit(rt, tenant, "piper-joe")
    calls = []

    def broken(*_args):
        calls.append(1)
        raise RuntimeError("database went away")

    monkeypatch.setattr(render_module, "get_runtime", lambda: rt)
    monkeypatch.setattr(render_module, "run_job", broken)
    task = app.tasks["omnijobs.render"]
    monkeypatch.setattr(task, "max_retries", 2)
    result = task.apply(args=[job.id])
    assert len(calls) == 3  # the first try and two retries
    assert result.failed()
    failed = rt.jobs.get(job.id)
    assert failed.status is JobStatus.FAILED and failed.error_code == "worker_unavailable"


def test_complete_survives_a_database_blip(rt, app, tenant, monkeypatch):  # noqa: F811
    real, blips = rt.jobs.complete, []

    def flaky(*args):
        if len(blips) < 2:
            blips.append(1)
            raise ServiceUnavailable("blip")
        return real(*args)

    monkeypatch.setattr(rt.jobs, "complete", flaky)
    monkeypatch.setattr(render_module.time, "sleep", lambda _s: None)
    job = submit(rt, tenant, "piper-joe")
    assert outcome(run_job(rt, app, job.id)) == "completed"
    assert len(blips) == 2 and rt.jobs.get(job.id).status is JobStatus.COMPLETED


def test_lease_is_held_until_the_job_is_recorded(rt, app, tenant, monkeypatch):  # noqa: F811
    real, seen = rt.jobs.complete, []

    def watching(job_id, *args):
        seen.append(any(t.name == f"lease-{job_id}" for t in threading.enumerate()))
        return real(job_id, *args)

    monkeypatch.setattr(rt.jobs, "complete", watching)
    job = submit(rt, tenant, "piper-joe")
    assert outcome(run_job(rt, app, job.id)) == "completed"
    assert seen == [True]


def test_bookkeeping_failure_on_the_finalize_thread_is_caught(rt, app, tenant,  # noqa: F811
                                                              monkeypatch, caplog):
    def broken(*_args):
        raise RuntimeError("unexpected")

    monkeypatch.setattr(rt.jobs, "complete", broken)
    job = submit(rt, tenant, "piper-joe")
    assert outcome(run_job(rt, app, job.id)) == "error"
    assert any("bookkeeping failed" in r.getMessage() for r in caplog.records)


def test_job_cancelled_during_generation_leaves_nothing(rt, app, tenant,  # noqa: F811
                                                       monkeypatch):
    """A cancel a moment before finalize (which the periodic heartbeat has not seen):
    the job ends cancelled, and whatever was uploaded meanwhile is deleted once the
    completing compare-and-set fails."""
    job = submit(rt, tenant, "test-snapshots")
    monkeypatch.setattr(fake_pipelines, "AFTER_GENERATE",
                        lambda: rt.jobs.cancel(job.id, tenant))
    assert outcome(run_job(rt, app, job.id)) == "lost"  # finalized, then not ours
    assert not list(rt.settings.objects_dir.rglob(f"*{job.id}*/*"))
    assert rt.jobs.get(job.id).status is JobStatus.CANCELLED


def test_an_attempt_that_lost_its_job_to_another_deletes_its_uploads(rt, app, tenant,  # noqa: F811
                                                                     monkeypatch):
    """The reaper hands the job on while this attempt finalizes: what it uploaded is
    under its own attempt's keys, which no record will ever name, so it is deleted at
    once rather than left for the hourly orphan sweep."""
    job = submit(rt, tenant, "test-snapshots")
    monkeypatch.setattr(fake_pipelines, "AFTER_GENERATE", lambda: rt.jobs.requeue(
        job.id, 1, queue="q", delay_s=0, code="lease_expired", message="reaped"))
    uploaded: list[str] = []
    real_put = rt.store.put
    monkeypatch.setattr(rt.store, "put", lambda key, *a, **k: (
        uploaded.append(key), real_put(key, *a, **k))[1])
    assert outcome(run_job(rt, app, job.id)) == "lost"
    assert uploaded and all("/a1/" in key for key in uploaded)  # it did upload
    assert not [p for p in rt.settings.objects_dir.rglob("*")
                if p.is_file() and job.id in str(p)]
    assert rt.jobs.get(job.id).status is JobStatus.QUEUED  # the next attempt's


def test_the_upload_guard_renews_only_a_lease_not_confirmed_lately(rt, tenant):  # noqa: F811
    """Before an upload, a heartbeat confirmed within the last beat interval stands
    (no round trip); an older one is renewed at once, and a cancel it finds stops the
    upload."""
    from tasks.lease import Lease

    class Counted:  # the jobs repository, counting heartbeats
        beats = 0

        def heartbeat(self, *args, **kwargs) -> bool:
            Counted.beats += 1
            return rt.jobs.heartbeat(*args, **kwargs)

    job = submit(rt, tenant, "piper-joe")
    claimed = rt.jobs.claim(job.id, "w", 60)
    lease = Lease(Counted(), job.id, claimed.attempts, lease_s=3)  # beats every second
    rt.jobs.cancel(job.id, tenant)
    assert lease.lost_unless_recent() is False and Counted.beats == 0  # the claim's
    time.sleep(lease.interval_s)
    assert lease.lost_unless_recent() is True and Counted.beats == 1  # renewed: cancelled


def test_progress_is_recorded_within_half_a_second_not_at_the_next_beat(rt, tenant):  # noqa: F811
    """A job shorter than the beat interval (2 s here) still records its progress, and
    its watchers hear of it, while it runs: at most every PROGRESS_EVERY_S."""
    from tasks import lease as module
    from tasks.lease import Lease

    sent, heard = [], threading.Event()

    class Recorded:  # the jobs repository, recording each heartbeat's progress
        def heartbeat(self, job_id, attempt, lease_s, progress=None) -> bool:
            sent.append(progress)
            return rt.jobs.heartbeat(job_id, attempt, lease_s, progress)

    job = submit(rt, tenant, "piper-joe")
    claimed = rt.jobs.claim(job.id, "w", 60)
    lease = Lease(Recorded(), job.id, claimed.attempts, lease_s=60,
                  on_progress=heard.set).start()
    try:
        lease.report_progress(0.2)  # within PROGRESS_EVERY_S of the claim: kept for later
        time.sleep(module.PROGRESS_EVERY_S)
        lease.report_progress(0.5)
        assert heard.wait(5) and sent == [49]  # long before the 2 s beat
    finally:
        lease.stop()
    assert rt.jobs.get(job.id).progress == 49


def test_requeue_resets_progress(rt, tenant):  # noqa: F811
    job = submit(rt, tenant, "piper-joe")
    claimed = rt.jobs.claim(job.id, "w", 60)
    rt.jobs.heartbeat(job.id, claimed.attempts, 60, progress=70)
    rt.jobs.requeue(job.id, claimed.attempts, queue="q", delay_s=0, code="x", message="y")
    assert rt.jobs.get(job.id).progress == 0


def test_reaper_fail_path_spares_a_live_last_attempt(rt, app, tenant):  # noqa: F811
    job = submit(rt, tenant, "piper-joe")
    for _ in range(rt.settings.max_attempts - 1):
        claimed = rt.jobs.claim(job.id, "w", lease_s=60)
        rt.jobs.requeue(job.id, claimed.attempts, queue="q", delay_s=0, code="x", message="y")
    last = rt.jobs.claim(job.id, "w", lease_s=-1)
    stale_view = rt.jobs.expired_leases()[0]
    assert stale_view.attempts == last.attempts == rt.settings.max_attempts
    assert rt.jobs.heartbeat(job.id, last.attempts, lease_s=60)
    assert reclaim(rt, app, stale_view) is False
    assert rt.jobs.get(job.id).status is JobStatus.RUNNING


FAKE = {"engine_factory": "tests.fake_omni:make_engine",
        "tokenizer_factory": "tests.fake_omni:make_tokenizer"}


def test_engine_silence_timeout_resets_on_every_output():
    pipeline = AudexTTS({**FAKE, "request_timeout_s": 1.0})
    pipeline.load()
    # [slow] spaces outputs 0.4 s apart: about 2 s in all, twice the timeout
    pieces = list(pipeline.speech(SpeechRequest(input="[slow] one two three"),
                                  RunContext("job_s")))
    assert pieces


def test_engine_abort_after_a_cancel_is_a_cancel():
    from core.errors import JobCancelled
    from pipelines.omni_bridge import OmniBridge
    from tests.fake_omni import make_engine

    bridge = OmniBridge(lambda: make_engine("m", "audex_tts.yaml"))
    with pytest.raises(JobCancelled):
        list(bridge.stream({"prompt": "[engine-abort] x"}, bridge.default_params(), "r1",
                           lambda: True))


def test_lease_is_not_renewed_past_the_maximum_runtime(rt, tenant):  # noqa: F811
    from tasks.lease import Lease

    job = submit(rt, tenant, "piper-joe")
    claimed = rt.jobs.claim(job.id, "w", lease_s=60)
    fired = threading.Event()
    lease = Lease(rt.jobs, job.id, claimed.attempts, lease_s=0.3, max_runtime_s=0.5,
                  on_timeout=fired.set).start()
    assert fired.wait(10)
    before = rt.jobs.get(job.id).lease_expires_at
    lease.beat()
    assert rt.jobs.get(job.id).lease_expires_at == before  # not renewed any more
    assert lease.is_cancelled()
    lease.stop()


def test_a_pipeline_stopped_by_its_runtime_limit_timed_out_not_cancelled(rt):  # noqa: F811
    from core.errors import JobCancelled, JobTimedOut
    from tasks.lease import Lease
    from tasks.render import stop_reason

    cancelled = JobCancelled("stopped")
    overdue = Lease(rt.jobs, "job_x", 1, lease_s=5, max_runtime_s=0)
    time.sleep(0.01)
    reason = stop_reason(overdue, cancelled)
    assert isinstance(reason, JobTimedOut) and reason.code == "timeout" and reason.retryable
    assert stop_reason(Lease(rt.jobs, "job_x", 1, lease_s=5), cancelled) is cancelled


@pytest.mark.parametrize("left", [1, 0])
def test_a_lost_attempts_time_is_counted_up_to_its_last_heartbeat(rt, app, tenant,  # noqa: F811
                                                                  left):
    """A worker killed outright reports nothing; the reaper records the attempt's time
    from its claim to its last heartbeat (the lease's expiry less one lease), as failed
    render time, whether the job goes back to the queue or fails."""
    from datetime import UTC, datetime, timedelta

    from sqlalchemy import update

    from storage.models import Job, JobAttempt

    job = submit(rt, tenant, "piper-joe")
    for _ in range(rt.settings.max_attempts - 1 - left):
        claimed = rt.jobs.claim(job.id, "w", lease_s=60)
        rt.jobs.requeue(job.id, claimed.attempts, queue="q", delay_s=0, code="x", message="y",
                        render=(0.0, None))
    claimed = rt.jobs.claim(job.id, "w", lease_s=60)
    now = datetime.now(UTC)
    with rt.jobs._sessions.begin() as s:  # claimed 30 s ago; its lease ran out 10 s ago
        s.execute(update(JobAttempt).where(JobAttempt.job_id == job.id,
                                           JobAttempt.attempt == claimed.attempts)
                  .values(claimed_at=now - timedelta(seconds=30)))
        s.execute(update(Job).where(Job.id == job.id).values(
            lease_expires_at=now - timedelta(seconds=10)))
    [stale] = [j for j in rt.jobs.expired_leases() if j.id == job.id]
    assert reclaim(rt, app, stale)
    seen = 20.0 - rt.settings.lease_s  # to the last heartbeat: one lease before expiry
    lost = rt.jobs.attempts(job.id)[claimed.attempts - 1]
    assert lost.outcome in ("retried", "failed") and abs(lost.render_s - seen) < 1.0
    if left == 0:  # failed for good: the usage record has the lost time as failed time
        usage = rt.jobs.get(job.id).usage
        assert abs(usage.failed_render_s - seen) < 1.0
