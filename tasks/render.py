"""The render task: claim -> generate -> (background) finalize -> complete.

Generation runs in the task; finalize (validate, encode/mux, probe, upload, complete)
runs on the worker's FinalizePool so the accelerator starts the next job at once.
Every exit records a reason: ``completed`` with outputs, ``failed`` with a code and
message, or back to ``queued`` for a retry when the error is retryable and attempts
remain. A job we lost (cancelled, reclaimed) is left alone.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from concurrent.futures import Future
from datetime import UTC, datetime
from typing import Any

from celery import Celery
from celery.exceptions import Reject

from core.errors import (
    DeadlineExceeded,
    EngineDead,
    JobCancelled,
    JobFailure,
    JobTimedOut,
    OmniJobsError,
    ServiceUnavailable,
)
from core.jobs import JobKind, JobStatus
from media.audio import AudioAggregator
from pipelines import RunContext, SpeechRequest, VideoRequest, get_spec
from storage.bus import Result
from storage.records import JobRecord, OutputRecord

from .dispatch import RENDER_TASK, publish_and_mark
from .finalize import cancelled_guard, finalize_speech, finalize_video
from .lease import Lease
from .live import AudioTap, hand_result, notify
from .metrics import FINALIZE_SECONDS, GENERATE_SECONDS, JOBS_FINISHED
from .runtime import WorkerRuntime, get_runtime
from .uploads import PatientStore, discard_uploads
from .usage import spent

log = logging.getLogger(__name__)

GENERATE_SHARE = 0.85  # progress share of generation; finalize takes the rest
DEADLINE_GRACE_S = 5.0  # a pipeline past its caller's max_run_s has this long to stop


def generate(rt: WorkerRuntime, job: JobRecord, lease: Lease) -> Any:
    """The accelerator's part: run the pipeline and aggregate its output."""
    spec = get_spec(job.pipeline)
    pipeline = rt.pipeline(job.pipeline)
    ctx = RunContext(job_id=job.id,
                     report_progress=lambda f: lease.report_progress(GENERATE_SHARE * f),
                     is_cancelled=lease.is_cancelled)
    if job.kind is JobKind.SPEECH:
        aggregator = AudioAggregator(spec.audio_mode)
        tap = AudioTap(rt.bus, job.id, job.attempts)
        for piece in pipeline.speech(SpeechRequest.from_dict(job.request), ctx):
            tap.add(aggregator.add(piece.samples, piece.sample_rate), aggregator)
        tap.finish(aggregator)
        return aggregator.result()
    if job.kind is JobKind.VIDEO:
        return pipeline.video(VideoRequest.from_dict(job.request), ctx)
    raise JobFailure(f"job kind {job.kind.value} is not supported", code="unsupported_kind")


def finalize(job: JobRecord, raw: Any, lease: Lease,
             store: PatientStore) -> list[OutputRecord]:
    spec = get_spec(job.pipeline)
    cancelled_guard(lease.is_cancelled)()  # what the heartbeat thread knows: no round trip
    guard = upload_guard(lease)
    if job.kind is JobKind.SPEECH:
        fmt = SpeechRequest.from_dict(job.request).response_format
        return [finalize_speech(store, job, spec, raw, fmt, guard)]
    return finalize_video(
        store, job, spec, raw, VideoRequest.from_dict(job.request), guard,
        lambda f: lease.report_progress(GENERATE_SHARE + (1 - GENERATE_SHARE) * f))


def upload_guard(lease: Lease) -> Callable[[], None]:
    """Before each upload: is the job still ours? The first upload takes a heartbeat
    confirmed within the last beat interval as current, so a job's single output costs
    no round trip; every later one renews the lease first, so a cancel stops a video's
    remaining outputs. (Keys name their attempt: a late upload overwrites nothing.)"""
    checks = iter([lease.lost_unless_recent])

    def guard() -> None:
        if next(checks, lease.lost_now)():
            raise JobCancelled("job was cancelled")
    return guard


def backoff_s(base: float, attempt: int) -> float:
    """Exponential backoff with full jitter, capped at five minutes."""
    return random.uniform(0, min(300.0, base * 2 ** max(0, attempt - 1)))


def cost(rt: WorkerRuntime, job: JobRecord, lease: Lease) -> tuple[float, str]:
    """The attempt's (seconds, device), counted once (tasks/usage.py)."""
    return spent(lease, job, rt.settings.metrics_tenant_label)


def record_failure(rt: WorkerRuntime, app: Celery, job: JobRecord, exc: BaseException,
                   lease: Lease) -> str:
    render = cost(rt, job, lease)
    if isinstance(exc, DeadlineExceeded):
        rt.jobs.cancel_overdue(job.id, job.attempts, exc.message, render)
        return "deadline_exceeded"
    if isinstance(exc, JobCancelled):  # someone else ended it: our time goes on the record
        rt.jobs.record_render(job.id, job.attempts, *render)
        return "cancelled"
    if not isinstance(exc, OmniJobsError):  # a bug: fail with a reason, never a trace
        log.error("job %s: unexpected error", job.id, exc_info=exc, extra={"job_id": job.id})
        exc = JobFailure(f"internal error while rendering ({type(exc).__name__})",
                         code="internal_error")
    log.warning("job %s: %s: %s", job.id, exc.code, exc.message, extra={"job_id": job.id})
    if isinstance(exc, EngineDead):
        rt.request_restart()
    if exc.retryable and job.attempts < job.max_attempts:
        msg = rt.jobs.requeue(job.id, job.attempts, queue=get_spec(job.pipeline).queue,
                              delay_s=backoff_s(rt.settings.retry_backoff_s, job.attempts),
                              code=exc.code, message=exc.message, render=render)
        publish_and_mark(app, rt.outbox, msg)
        return "retrying"
    rt.jobs.fail(job.id, exc.code, exc.message, attempt=job.attempts, render=render)
    return "failed"


def finish(rt: WorkerRuntime, app: Celery, job: JobRecord, raw: Any, lease: Lease) -> str:
    """Runs on the finalize thread, where nobody reads the Future: log what escapes."""
    store = PatientStore(rt.store, cancelled_guard(lease.lost_now), rt.settings.storage_retry_s)
    try:
        result, outputs = _finish(rt, app, job, store, raw, lease)
    except Exception:
        log.exception("job %s: finalize bookkeeping failed; the reaper will retry it",
                      job.id, extra={"job_id": job.id})
        result, outputs = "error", []
    if result == "completed" and len(outputs) == 1 and outputs[0].key in store.small:
        out = outputs[0]
        hand_result(rt.bus, Result(job.id, job.attempts, out.content_type,
                                   store.small[out.key]))
    notify(rt.bus, job.id)
    JOBS_FINISHED.labels(job.pipeline, result).inc()
    return result


def complete(rt: WorkerRuntime, job: JobRecord, outputs: list[OutputRecord],
             render: tuple[float, str] | None = None) -> bool:
    """The compare-and-set is idempotent, so a database blip is worth a few retries; a
    commit whose reply was lost shows up as our attempt already completed."""
    for delay in (0.5, 1.0, 2.0, None):
        try:
            if rt.jobs.complete(job.id, job.attempts, outputs, rt.settings.output_ttl_s,
                                render):
                return True
            now = rt.jobs.get(job.id)
            return bool(now and now.status is JobStatus.COMPLETED
                        and now.attempts == job.attempts)
        except ServiceUnavailable:
            if delay is None:
                raise
            log.warning("completing job %s failed; retrying", job.id,
                        extra={"job_id": job.id})
            time.sleep(delay)
    return False


def _finish(rt: WorkerRuntime, app: Celery, job: JobRecord, store: PatientStore, raw: Any,
            lease: Lease) -> tuple[str, list[OutputRecord]]:
    """The outcome, and the outputs recorded when it is ``completed``."""
    with lease:  # held until the job is recorded, so the reaper leaves it alone
        with FINALIZE_SECONDS.labels(job.pipeline).time():
            try:
                outputs = finalize(job, raw, lease, store)
            except Exception as exc:
                result = stopped(rt, app, job, lease, exc)
                discard_uploads(rt, job, store.uploaded)
                return result, []
        if not complete(rt, job, outputs, cost(rt, job, lease)):
            log.info("job %s finished but was no longer ours; result dropped", job.id,
                     extra={"job_id": job.id})
            rt.jobs.record_render(job.id, job.attempts, *cost(rt, job, lease))
            discard_uploads(rt, job, store.uploaded)
            return "lost", []
    log.info("job %s completed", job.id, extra={"job_id": job.id})
    return "completed", outputs


def stopped(rt: WorkerRuntime, app: Celery, job: JobRecord, lease: Lease,
            exc: BaseException) -> str:
    """Generation or finalize raised: record why, unless the job was handed back (the
    worker drains), whose stop is no failure and whose record is already written."""
    if lease.handed_back:  # the attempt is closed; its time still goes on the record
        rt.jobs.record_render(job.id, job.attempts, *cost(rt, job, lease))
        return "handed_back"
    return record_failure(rt, app, job, stop_reason(lease, exc), lease)


def timeout_error(limit_s: float) -> JobTimedOut:
    return JobTimedOut(f"the job ran past its pipeline's maximum runtime ({limit_s:g} s)")


def deadline_error(limit_s: float) -> DeadlineExceeded:
    return DeadlineExceeded(f"the job ran past its maximum run time (max_run_s {limit_s:g})")


def stop_reason(lease: Lease, exc: BaseException) -> BaseException:
    """A pipeline that stopped because its lease ran past the maximum runtime (it saw
    itself cancelled) timed out, or, where the bound was the caller's ``max_run_s``,
    exceeded its deadline; it was not cancelled."""
    if isinstance(exc, JobCancelled) and lease.overdue():
        return (deadline_error if lease.own_deadline else timeout_error)(lease.max_runtime_s)
    return exc


def timed_out(rt: WorkerRuntime, app: Celery, job: JobRecord, lease: Lease) -> None:
    """On the lease's watchdog thread, past the maximum runtime: record ``timeout``
    (retry or fail, a compare-and-set on our attempt), then recycle the process. Past
    the caller's own ``max_run_s``: record ``deadline_exceeded`` at once and recycle
    only if the pipeline has not stopped within ``DEADLINE_GRACE_S`` (a cooperative one
    stops at its next chunk, and the model stays loaded)."""
    limit_s = lease.max_runtime_s
    error = (deadline_error if lease.own_deadline else timeout_error)(limit_s)
    try:
        outcome = record_failure(rt, app, job, error, lease)
        notify(rt.bus, job.id)
        JOBS_FINISHED.labels(job.pipeline, f"timeout-{outcome}").inc()
    except Exception:
        log.exception("job %s timed out and could not be recorded; the reaper will",
                      job.id, extra={"job_id": job.id})
    if lease.own_deadline and lease.wait_stopped(DEADLINE_GRACE_S):
        return
    rt.recycle()


def expired_at_claim(rt: WorkerRuntime, job: JobRecord) -> bool:
    """A first attempt claimed after the job's start deadline: the job ends ``expired``
    and never runs (the maintenance sweep expires those still queued)."""
    if job.start_by is None or job.attempts != 1 or datetime.now(UTC) <= job.start_by:
        return False
    rt.jobs.expire_claimed(job.id, job.attempts, "the job was claimed after its start "
                           "deadline and did not run")
    notify(rt.bus, job.id)
    JOBS_FINISHED.labels(job.pipeline, "expired").inc()
    return True


def run_job(rt: WorkerRuntime, app: Celery, job_id: str,
            token: str | None = None) -> str | Future:
    """Returns an outcome, or the Future of the finalize stage it handed off. The message
    wakes its job's lane: the fairest ready job there is claimed, as long as some queued
    job still holds the message's dispatch ``token``; a draining worker claims nothing
    (the message goes back to its queue for another worker). A claim waits for a free
    engine slot (tasks/slots.py), and the job holds its slots until its generation ends."""
    if not rt.slots.take(stop=lambda: rt.drain.started):
        raise Reject("the worker is draining", requeue=True)
    held = 1
    try:
        job = claim(rt, job_id, token)
        if isinstance(job, str):
            return job
        held += rt.slots.grow(rt.slot_weight(job.pipeline, job.request) - 1)
        generated = render_claimed(rt, app, job)
    finally:
        rt.slots.give(held)
    if isinstance(generated, str):
        return generated
    return rt.finalizer.submit(finish, rt, app, job, *generated)


def claim(rt: WorkerRuntime, job_id: str, token: str | None) -> JobRecord | str:
    """The job this message claims, or the outcome when it claims none to render."""
    if token is None:  # a message from before dispatch tokens: that job or nothing
        job = rt.jobs.claim(job_id, rt.worker_id, rt.settings.lease_s)
    else:
        job = rt.jobs.claim_next(token, rt.worker_id, rt.settings.lease_s)
    if job is None:
        log.info("message of job %s claimed nothing (its lane had no ready job, or the "
                 "message was superseded)", job_id, extra={"job_id": job_id})
        return "skipped"
    if expired_at_claim(rt, job):
        return "expired"
    log.info("job %s claimed (attempt %d) on the message of job %s", job.id, job.attempts,
             job_id, extra={"job_id": job.id})
    return job


def render_claimed(rt: WorkerRuntime, app: Celery, job: JobRecord) -> str | tuple[Any, Lease]:
    """Generate a claimed job under its lease: (output, lease) for finalize, or the
    outcome when generation stopped."""
    notify(rt.bus, job.id, running=True)
    limit = rt.max_runtime_s(job.pipeline)
    # the caller's bound up to the limit itself, which the API accepts (api/deadlines.py)
    own = job.max_run_s is not None and job.max_run_s <= limit
    lease = Lease(rt.jobs, job.id, job.attempts, rt.settings.lease_s,
                  job.max_run_s if own else limit,
                  on_timeout=lambda: timed_out(rt, app, job, lease),
                  on_progress=lambda: notify(rt.bus, job.id, running=True),
                  pipeline=job.pipeline,
                  in_flight=rt.in_flight)
    lease.own_deadline = own
    lease.start()
    try:
        with GENERATE_SECONDS.labels(job.pipeline).time():
            raw = generate(rt, job, lease)
    except Exception as exc:
        lease.stop()
        result = stopped(rt, app, job, lease, exc)
        notify(rt.bus, job.id)
        JOBS_FINISHED.labels(job.pipeline, result).inc()
        return result
    lease.mark_generated()
    return raw, lease


START_RETRIES = 20  # about 20 minutes of a database (or runtime) that won't come up


def give_up(job_id: str, tries: int, exc: BaseException) -> None:
    """A render that never got to start: fail the job with that reason if we can."""
    try:
        get_runtime().jobs.fail(job_id, "worker_unavailable",
                                f"the render could not start after {tries} tries "
                                f"({type(exc).__name__})", from_status=JobStatus.QUEUED)
    except Exception:
        log.error("job %s could not start and could not be failed", job_id,
                  extra={"job_id": job_id})


def register(app: Celery) -> None:
    @app.task(name=RENDER_TASK, bind=True, shared=False, acks_late=True, reject_on_worker_lost=True,
              ignore_result=True, max_retries=START_RETRIES)
    def render(self, job_id: str, token: str | None = None) -> str:
        try:
            result = run_job(get_runtime(), app, job_id, token)
        except Reject:
            raise
        except Exception as exc:
            # Failed before the job was claimed (e.g. the database is down): keep the
            # message alive instead of letting Celery acknowledge it into oblivion.
            if self.request.retries >= self.max_retries:
                give_up(job_id, self.request.retries + 1, exc)
                raise
            delay = min(60.0, 2.0 * 2 ** min(self.request.retries, 5))
            log.warning("render %s could not start (%s); retrying in %.0fs", job_id,
                        type(exc).__name__, delay, extra={"job_id": job_id})
            raise self.retry(countdown=delay, exc=exc) from exc
        return "finalizing" if isinstance(result, Future) else result
