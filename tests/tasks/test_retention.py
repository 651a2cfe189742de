"""Retention and orphans on a real database and the local store: no object of a deleted
or ended job survives, whatever the order of a delete, a cancel and the last upload."""

from __future__ import annotations

import hashlib
import time
import uuid

import numpy as np

from core.jobs import JobStatus
from media.audio import Audio
from pipelines import get_spec
from storage.views import job_view, video_view
from tasks.finalize import finalize_speech, output_key
from tasks.render import run_job
from tasks.retention import apply_retention, sweep_orphans

from .test_render import app, outcome, rt, submit, tenant  # noqa: F401  (fixtures)


def stored(rt, job_id: str) -> list:  # noqa: F811
    return sorted(rt.settings.objects_dir.rglob(f"*{job_id}*/*"))


def test_delete_racing_the_final_upload_leaves_no_object(rt, app, tenant,  # noqa: F811
                                                         monkeypatch):
    """The upload guard passes, then DELETE cancels the job, removes its objects and its
    row, then the upload lands: the worker that loses the final compare-and-set removes
    what it uploaded."""
    job = submit(rt, tenant, "piper-joe")
    real_put = rt.store.put

    def racing_put(key, data, content_type):
        rt.jobs.cancel(job.id, tenant)
        rt.store.delete([key])
        rt.jobs.delete(job.id, tenant)
        real_put(key, data, content_type)

    monkeypatch.setattr(rt.store, "put", racing_put)
    outcome(run_job(rt, app, job.id))
    assert rt.jobs.get(job.id) is None
    assert stored(rt, job.id) == []


def test_cancel_between_two_uploads_leaves_no_object(rt, app, tenant,  # noqa: F811
                                                     monkeypatch):
    job = submit(rt, tenant, "test-video", prompt="ok", seconds=1, size="64x48", fps=24, n=2)
    real_put, puts = rt.store.put, []

    def cancelling_put(key, data, content_type):
        real_put(key, data, content_type)
        puts.append(key)
        rt.jobs.cancel(job.id, tenant)  # lands after the first of two videos is stored

    monkeypatch.setattr(rt.store, "put", cancelling_put)
    assert outcome(run_job(rt, app, job.id)) == "cancelled"
    assert len(puts) == 1
    assert rt.jobs.get(job.id).status is JobStatus.CANCELLED
    assert stored(rt, job.id) == []


def test_orphan_sweep_removes_only_objects_no_job_owns(rt, app, tenant):  # noqa: F811
    done = submit(rt, tenant, "piper-joe")
    assert outcome(run_job(rt, app, done.id)) == "completed"
    [kept] = [o.key for o in rt.jobs.get(done.id).outputs]
    running = submit(rt, tenant, "piper-joe")
    rt.jobs.claim(running.id, "w", 60)
    failed = submit(rt, tenant, "piper-joe")
    rt.jobs.claim(failed.id, "w", 60)
    rt.jobs.fail(failed.id, "x", "y")
    gone = "job_" + uuid.uuid4().hex
    in_flight = f"{tenant}/{running.id}/0.wav"
    foreign = ["files/batch_input.jsonl", f"{tenant}/not-a-job/0.wav"]
    orphans = [f"{tenant}/{done.id}/7.wav", f"{tenant}/{gone}/0.wav",
               f"{tenant}/{failed.id}/0.wav"]
    for key in [in_flight, *foreign, *orphans]:
        rt.store.put(key, b"x", "application/octet-stream")
    assert sweep_orphans(rt, app) == len(orphans)
    assert set(rt.store.list_keys()) == {kept, in_flight, *foreign}
    assert sweep_orphans(rt, app) == 0


def test_outputs_expire_then_the_job_record(rt, app, tenant):  # noqa: F811
    rt.settings.output_ttl_s = 0.5
    job = submit(rt, tenant, "piper-joe")
    assert outcome(run_job(rt, app, job.id)) == "completed"
    done = rt.jobs.get(job.id)
    assert (done.expires_at - done.completed_at).total_seconds() == 0.5
    fresh = job_view(done, rt.store, 60)
    assert fresh.expires_at is not None and fresh.outputs[0].url and not fresh.outputs[0].expired
    time.sleep(0.6)
    # Expired as soon as the period has passed, whether or not maintenance ran yet.
    shown = job_view(rt.jobs.get(job.id), rt.store, 60).outputs[0]
    assert shown.expired and shown.url is None and shown.bytes == done.outputs[0].bytes
    assert apply_retention(rt, app) == 1
    assert stored(rt, job.id) == []
    kept = rt.jobs.get(job.id)
    assert kept.outputs_deleted_at is not None and len(kept.outputs) == 1
    assert apply_retention(rt, app) == 0
    rt.settings.job_ttl_s = 0.1
    assert apply_retention(rt, app) == 1
    assert rt.jobs.get(job.id) is None


def test_video_expires_at_is_set_at_completion(rt, app, tenant):  # noqa: F811
    job = submit(rt, tenant, "test-video", prompt="ok", seconds=1, size="64x48", fps=24)
    assert video_view(rt.jobs.get(job.id), rt.store, 60).expires_at is None
    assert outcome(run_job(rt, app, job.id)) == "completed"
    view = video_view(rt.jobs.get(job.id), rt.store, 60)
    assert view.expires_at == view.completed_at + int(rt.settings.output_ttl_s)


def tone(seconds: float, rate: int, pitch: float) -> Audio:
    t = np.arange(int(seconds * rate)) / rate
    return Audio((0.3 * np.sin(2 * np.pi * pitch * t)).astype(np.float32)[None, :], rate)


def test_a_stale_attempt_cannot_overwrite_the_current_output(rt, tenant):  # noqa: F811
    """Attempt 1's lease was reaped and attempt 2 completed; attempt 1 then uploads its
    own result. The completed job's bytes must still be attempt 2's (its sha256)."""
    spec = get_spec("piper-joe")
    job = submit(rt, tenant, "piper-joe")
    stale = rt.jobs.claim(job.id, "w1", 60)
    assert rt.jobs.requeue(job.id, 1, queue=spec.queue, delay_s=0, code="lease_expired",
                           message="reaped")
    current = rt.jobs.claim(job.id, "w2", 60)
    assert (stale.attempts, current.attempts) == (1, 2)
    out = finalize_speech(rt.store, current, spec, tone(1.0, spec.sample_rate, 440), "wav")
    assert rt.jobs.complete(job.id, 2, [out], 3600)
    late = finalize_speech(rt.store, stale, spec, tone(1.5, spec.sample_rate, 220), "wav")
    [recorded] = rt.jobs.get(job.id).outputs
    assert hashlib.sha256(rt.store.get(recorded.key)).hexdigest() == recorded.sha256
    assert late.key != recorded.key
    # the stale attempt's object is an orphan: the sweep removes it, keeps the output
    assert sweep_orphans(rt, None) == 1
    assert set(rt.store.list_keys(f"{tenant}/{job.id}/")) == {recorded.key}


def test_the_sweep_removes_superseded_attempts_of_a_running_job(rt, tenant):  # noqa: F811
    spec = get_spec("piper-joe")
    job = submit(rt, tenant, "piper-joe")
    rt.jobs.claim(job.id, "w1", 60)
    rt.jobs.requeue(job.id, 1, queue=spec.queue, delay_s=0, code="lease_expired",
                    message="reaped")
    first = f"{tenant}/{job.id}/a1/0.wav"
    rt.store.put(first, b"x", "audio/wav")  # attempt 1 uploaded after it was reaped
    assert sweep_orphans(rt, None) == 1  # queued again: attempt 1 is over
    rt.jobs.claim(job.id, "w2", 60)
    superseded, current = f"{tenant}/{job.id}/a1/0.wav", f"{tenant}/{job.id}/a2/0.wav"
    legacy = f"{tenant}/{job.id}/0.wav"  # written before keys named their attempt
    for key in (superseded, current, legacy):
        rt.store.put(key, b"x", "audio/wav")
    assert sweep_orphans(rt, None) == 1
    assert set(rt.store.list_keys(f"{tenant}/{job.id}/")) == {current, legacy}


def test_output_keys_name_the_attempt(rt, tenant):  # noqa: F811
    job = submit(rt, tenant, "piper-joe")
    claimed = rt.jobs.claim(job.id, "w1", 60)
    assert output_key(claimed, 0, "wav") == f"{tenant}/{job.id}/a1/0.wav"
