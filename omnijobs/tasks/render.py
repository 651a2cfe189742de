"""The render task: claim -> generate -> aggregate -> finalize -> complete.

Every exit records a reason: a job ends ``completed`` with its outputs, ``failed`` with
a code and message, or goes back to ``queued`` for a retry when the error is retryable
and attempts remain. A job we lost (cancelled, reclaimed) is left alone.
"""

from __future__ import annotations

import logging
import random

from celery import Celery

from ..core.errors import JobCancelled, JobFailure, OmniJobsError
from ..core.jobs import JobKind
from ..media.audio import AudioAggregator
from ..pipelines import RunContext, SpeechRequest, get_spec
from ..storage.records import JobRecord, OutputRecord
from .dispatch import RENDER_TASK, publish_and_mark
from .finalize import finalize_speech
from .lease import Lease
from .runtime import WorkerRuntime, get_runtime

log = logging.getLogger(__name__)


def produce(rt: WorkerRuntime, job: JobRecord, lease: Lease) -> list[OutputRecord]:
    spec = get_spec(job.pipeline)
    pipeline = rt.pipeline(job.pipeline)
    ctx = RunContext(job_id=job.id, report_progress=lease.report_progress,
                     is_cancelled=lease.is_cancelled)
    if job.kind is JobKind.SPEECH:
        request = SpeechRequest.from_dict(job.request)
        aggregator = AudioAggregator(spec.audio_mode)
        for piece in pipeline.speech(request, ctx):
            aggregator.add(piece.samples, piece.sample_rate)
        if lease.is_cancelled():
            raise JobCancelled("job was cancelled")
        return [finalize_speech(rt.store, job, spec, aggregator.result(),
                                request.response_format)]
    raise JobFailure(f"job kind {job.kind.value} is not supported by this worker",
                     code="unsupported_kind")


def backoff_s(base: float, attempt: int) -> float:
    """Exponential backoff with full jitter, capped at five minutes."""
    return random.uniform(0, min(300.0, base * 2 ** max(0, attempt - 1)))


def record_failure(rt: WorkerRuntime, app: Celery, job: JobRecord, exc: OmniJobsError) -> str:
    if exc.retryable and job.attempts < job.max_attempts:
        msg = rt.jobs.requeue(job.id, job.attempts, queue=get_spec(job.pipeline).queue,
                              delay_s=backoff_s(rt.settings.retry_backoff_s, job.attempts),
                              code=exc.code, message=exc.message)
        publish_and_mark(app, rt.outbox, msg)
        return "retrying"
    rt.jobs.fail(job.id, exc.code, exc.message, attempt=job.attempts)
    return "failed"


def run_job(rt: WorkerRuntime, app: Celery, job_id: str) -> str:
    job = rt.jobs.claim(job_id, rt.worker_id, rt.settings.lease_s)
    if job is None:
        log.info("job %s not claimable (already taken, cancelled or finished)", job_id)
        return "skipped"
    log.info("job %s claimed (attempt %d)", job_id, job.attempts, extra={"job_id": job_id})
    with Lease(rt.jobs, job.id, job.attempts, rt.settings.lease_s) as lease:
        try:
            outputs = produce(rt, job, lease)
        except JobCancelled:
            return "cancelled"
        except OmniJobsError as exc:
            log.warning("job %s: %s: %s", job_id, exc.code, exc.message,
                        extra={"job_id": job_id})
            return record_failure(rt, app, job, exc)
        except Exception as exc:  # a bug: fail with a reason, never a stack trace
            log.exception("job %s: unexpected error", job_id, extra={"job_id": job_id})
            rt.jobs.fail(job.id, "internal_error",
                         f"internal error while rendering ({type(exc).__name__})",
                         attempt=job.attempts)
            return "failed"
    if not rt.jobs.complete(job.id, job.attempts, outputs):
        log.info("job %s finished but was no longer ours; result dropped", job_id)
        return "lost"
    log.info("job %s completed", job_id, extra={"job_id": job_id})
    return "completed"


def register(app: Celery) -> None:
    @app.task(name=RENDER_TASK, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
    def render(job_id: str) -> str:
        return run_job(get_runtime(), app, job_id)
