"""The public representation of a job: what ``GET`` returns, with freshly signed URLs.

Shared by everything that shows a job to its owner (the API's routes, webhook event
payloads, batch output lines, event streams), so each of them presents exactly what a
``GET`` of the same resource would.
"""

from __future__ import annotations

from dataclasses import MISSING, fields
from datetime import UTC, datetime
from typing import Any, Literal, get_type_hints

from pydantic import BaseModel, Field, create_model

from core.jobs import JobKind, JobStatus

from .objects import ObjectStore
from .records import OUTPUT_DESCRIPTION, JobRecord, OutputRecord, QueueStanding
from .usage_views import OUTPUT_TOKENS_PER_S, UsagePublic, usage_view

# A job's status in OpenAI's four video statuses (queued, in_progress, completed,
# failed), with the error code of one that ended without a video of its own fault: the
# job's own status stays on /v1/jobs. Unlisted statuses are named as they are.
VIDEO_STATUS: dict[JobStatus, tuple[str, str | None]] = {
    JobStatus.RUNNING: ("in_progress", None),
    JobStatus.CANCELLED: ("failed", "cancelled"),  # deadline_exceeded among them
    JobStatus.EXPIRED: ("failed", "expired"),  # never started: start_deadline_exceeded
}
DEADLINE_EXCEEDED = "deadline_exceeded"  # the code of a job cancelled at its max_run_s
# OpenAI's video sizes; a size outside them is reported as the one of its orientation
# (the pixels themselves are ``resolution``).
OPENAI_SIZES = ("720x1280", "1280x720", "1024x1792", "1792x1024")


class JobError(BaseModel):
    code: str
    message: str


class OutputLink(BaseModel):
    """An expired output (past ``OMNIJOBS_OUTPUT_TTL_S``) keeps its description but has
    no URL: its bytes are deleted."""

    index: int
    url: str | None
    url_expires_at: int | None
    expired: bool = False


def _described(record: type) -> dict[str, tuple[Any, Any]]:
    """``OUTPUT_DESCRIPTION``'s fields as the record declares them: (type, default)."""
    hints, declared = get_type_hints(record), {f.name: f for f in fields(record)}
    return {name: (hints[name], ... if declared[name].default is MISSING
                   else declared[name].default) for name in OUTPUT_DESCRIPTION}


# An output as its owner sees it: where to fetch it, then its record's description.
OutputPublic = create_model("OutputPublic", __base__=OutputLink, __module__=__name__,
                            __doc__=OutputLink.__doc__, **_described(OutputRecord))


# A queued job's ``status_detail`` when no live worker serves its pipeline (the API
# knows from the worker registry): the reason it waits, not a failure.
WAITING_FOR_A_WORKER = "waiting for a worker"


# Where a queued job stands (all null once it left the queue): the jobs of its pipeline
# and lane that will start before it in the fair-share order, and when it should start
# and end at the pipeline's recent pace with the workers live now; the two estimates are
# null, with ``estimate_unavailable_reason`` saying why, when there is nothing to
# estimate from. Declared last in the job and video objects, so ``id`` stays first.
QUEUE_POSITION = Field(None, description=(
    "Queued jobs: the jobs of its pipeline and lane that start before it in the "
    "fair-share order (0: next)"))
ESTIMATED_START_AT = Field(None, description=(
    "Queued jobs: when it should start (Unix seconds), at the pipeline's recent pace "
    "with its live workers"))
ESTIMATED_COMPLETED_AT = Field(None, description=(
    "Queued jobs: when it should be done (Unix seconds)"))
ESTIMATE_UNAVAILABLE_REASON = Field(None, description=(
    "Why the estimates are null: no_live_worker, no_recent_throughput, "
    "waiting_for_retry_backoff or worker_registry_unavailable"))


def queue_fields(standing: QueueStanding | None) -> dict:
    if standing is None:
        return {}
    return {"queue_position": standing.position,
            "estimated_start_at": timestamp(standing.start_at),
            "estimated_completed_at": timestamp(standing.completed_at),
            "estimate_unavailable_reason": standing.reason}


class JobPublic(BaseModel):
    id: str
    object: Literal["job"] = "job"
    kind: str
    model: str
    status: str
    status_detail: str | None = None  # why a job is where it is, when it is known
    progress: int
    attempts: int
    max_attempts: int
    created_at: int
    started_at: int | None
    completed_at: int | None
    expires_at: int | None
    error: JobError | None
    outputs: list[OutputPublic]
    metadata: dict[str, str] | None
    start_by: int | None = Field(default=None, description="The start deadline (set by "
                                 "start_within_s): not started by then, the job expires")
    max_run_s: float | None = None
    usage: UsagePublic | None = Field(default=None, description="What the job cost, once "
                                      "it has ended (null if it ended without running)")
    queue_position: int | None = QUEUE_POSITION
    estimated_start_at: int | None = ESTIMATED_START_AT
    estimated_completed_at: int | None = ESTIMATED_COMPLETED_AT
    estimate_unavailable_reason: str | None = ESTIMATE_UNAVAILABLE_REASON


class VideoPublic(BaseModel):
    id: str
    object: Literal["video"] = "video"
    model: str
    status: str
    status_detail: str | None = None
    progress: int
    created_at: int
    completed_at: int | None
    expires_at: int | None
    size: str  # one of OPENAI_SIZES (openai_size)
    resolution: str  # width x height asked of the model: the caller's size or its default
    seconds: str
    prompt: str
    fps: float
    n: int
    seed: int | None
    audio_sample_rate: int | None
    error: JobError | None
    outputs: list[OutputPublic]
    metadata: dict[str, str] | None
    usage: UsagePublic | None = None
    remixed_from_video_id: str | None = None  # no pipeline here remixes (yet)
    queue_position: int | None = QUEUE_POSITION
    estimated_start_at: int | None = ESTIMATED_START_AT
    estimated_completed_at: int | None = ESTIMATED_COMPLETED_AT
    estimate_unavailable_reason: str | None = ESTIMATE_UNAVAILABLE_REASON


def timestamp(value: datetime | None) -> int | None:
    return int(value.timestamp()) if value is not None else None


def outputs_expired(job: JobRecord, now: datetime | None = None) -> bool:
    """Past the retention period, whether or not maintenance has deleted the bytes yet."""
    if job.outputs_deleted_at is not None:
        return True
    return job.expires_at is not None and job.expires_at <= (now or datetime.now(UTC))


def described(out: OutputRecord) -> dict[str, Any]:
    return {name: getattr(out, name) for name in OUTPUT_DESCRIPTION}


def job_view(job: JobRecord, store: ObjectStore, url_ttl_s: int,
             detail: str | None = None, standing: QueueStanding | None = None) -> JobPublic:
    expired = outputs_expired(job)
    outputs = []
    for out in job.outputs:
        url, expires = (None, None) if expired else store.signed_url(out.key, url_ttl_s)
        outputs.append(OutputPublic(index=out.index, url=url, url_expires_at=expires,
                                    expired=expired, **described(out)))
    error = (JobError(code=job.error_code, message=job.error_message or "")
             if job.error_code and (job.status in (JobStatus.FAILED, JobStatus.EXPIRED)
                                    or job.error_code == DEADLINE_EXCEEDED) else None)
    return JobPublic(
        id=job.id, kind=job.kind.value, model=job.model, status=job.status.value,
        status_detail=detail, progress=job.progress, attempts=job.attempts,
        max_attempts=job.max_attempts,
        created_at=timestamp(job.created_at), started_at=timestamp(job.started_at),
        completed_at=timestamp(job.completed_at), expires_at=timestamp(job.expires_at),
        error=error, outputs=outputs, metadata=job.metadata,
        start_by=timestamp(job.start_by), max_run_s=job.max_run_s, usage=usage_view(job.usage),
        **queue_fields(standing))


def video_status(job: JobRecord, error: JobError | None) -> tuple[str, JobError | None]:
    """The video's status and error as OpenAI names them (VIDEO_STATUS)."""
    status, code = VIDEO_STATUS.get(job.status, (job.status.value, None))
    if code is not None and error is None:
        error = JobError(code=code, message=f"the job was {job.status.value}")
    return status, error


def openai_size(size: str) -> str:
    """``size`` if it is one of OpenAI's, else OpenAI's size of its orientation."""
    if size in OPENAI_SIZES:
        return size
    width, height = (int(v) for v in size.split("x"))
    return "720x1280" if height > width else "1280x720"


def video_view(job: JobRecord, store: ObjectStore, url_ttl_s: int,
               detail: str | None = None, standing: QueueStanding | None = None
               ) -> VideoPublic:
    pub = job_view(job, store, url_ttl_s)
    req = job.request
    rates = {o.sample_rate for o in job.outputs}
    status, error = video_status(job, pub.error)
    return VideoPublic(
        id=job.id, model=job.model, status=status,
        status_detail=detail, progress=job.progress, created_at=pub.created_at,
        completed_at=pub.completed_at, expires_at=pub.expires_at,
        size=openai_size(req["size"]), resolution=req["size"],
        seconds=f"{float(req['seconds']):g}", prompt=req["prompt"], fps=float(req["fps"]),
        n=int(req.get("n", 1)), seed=req.get("seed"),
        audio_sample_rate=rates.pop() if len(rates) == 1 else None,
        error=error, outputs=pub.outputs, metadata=job.metadata, usage=pub.usage,
        **queue_fields(standing))


def speech_usage(job: JobRecord) -> dict[str, int]:
    """OpenAI's speech ``usage`` in this service's units: input tokens are the input's
    characters (what a speech model's limit counts), output tokens the stored audio's
    20 ms frames (Audex's codec rate, the same measure for every pipeline)."""
    seconds = sum(o.duration_s or 0.0 for o in job.outputs)
    usage = {"input_tokens": len(job.request.get("input", "")),
             "output_tokens": round(seconds * OUTPUT_TOKENS_PER_S)}
    return {**usage, "total_tokens": usage["input_tokens"] + usage["output_tokens"]}


def resource_view(job: JobRecord, store: ObjectStore, url_ttl_s: int) -> JobPublic | VideoPublic:
    """A video job as ``GET /v1/videos/{id}`` shows it; any other as ``GET /v1/jobs/{id}``."""
    view = video_view if job.kind is JobKind.VIDEO else job_view
    return view(job, store, url_ttl_s)
