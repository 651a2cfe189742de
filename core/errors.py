"""The one error tree.

Every error the service raises on purpose is an ``OmniJobsError``. Each class says
when it is raised, which HTTP status it maps to (the mapping itself is applied once,
in the API's app factory) and whether a worker may retry the job that raised it.
Outside errors (botocore, PyAV, redis, onnxruntime) are translated where they enter,
with ``raise ... from exc``, so nothing else needs to know those libraries.
"""

from __future__ import annotations

from typing import Any

from .text import printable

ECHO_LIMIT = 32
MESSAGE_LIMIT = 500


def clip(value: Any, limit: int = ECHO_LIMIT) -> str:
    """Cut an echoed value so error messages never carry a caller's payload back (and
    escape what UTF-8 cannot encode, so the message can always be sent)."""
    text = value if isinstance(value, str) else repr(value)
    return printable(text if len(text) <= limit else text[:limit] + "...")


class OmniJobsError(Exception):
    """Base class. ``code`` is the stable machine-readable reason."""

    http_status = 500
    error_type = "server_error"
    code = "internal_error"
    retryable = False
    retry_after_s: int | None = None  # sent as Retry-After when set

    def __init__(self, message: str, *, code: str | None = None, param: str | None = None,
                 retryable: bool | None = None, retry_after_s: int | None = None) -> None:
        super().__init__(message[:MESSAGE_LIMIT])
        self.message = message[:MESSAGE_LIMIT]
        if code is not None:
            self.code = code
        if retryable is not None:
            self.retryable = retryable
        if retry_after_s is not None:
            self.retry_after_s = retry_after_s
        self.param = param


# ---- request errors (API, before anything is queued) -------------------------------

class InvalidRequest(OmniJobsError):
    """The request is malformed or breaks a pipeline's contract. Nothing was stored."""

    http_status = 400
    error_type = "invalid_request_error"
    code = "invalid_request"


class WebhookUrlRefused(InvalidRequest):
    """A webhook URL is malformed or reaches an address the SSRF guard refuses
    (loopback, private, link-local, CGNAT, multicast, cloud metadata) and no allowed
    network covers it. At delivery time the same check fails the attempt instead."""

    code = "webhook_url_refused"


class ModelNotFound(InvalidRequest):
    """The requested model is not served by any enabled pipeline."""

    code = "model_not_found"


class AuthenticationFailed(OmniJobsError):
    """Missing, malformed or unknown API key."""

    http_status = 401
    error_type = "invalid_request_error"
    code = "invalid_api_key"


class SignInRequired(AuthenticationFailed):
    """A console page asked for without a session: none, signed out, or idle past
    ``OMNIJOBS_CONSOLE_IDLE_S`` (a page is sent to the sign-in form instead)."""

    code = "sign_in_required"


class CsrfRefused(OmniJobsError):
    """A console action without its session's CSRF token (or with another one): refused
    before it does anything."""

    http_status = 403
    error_type = "invalid_request_error"
    code = "csrf_token_invalid"


class NotFound(OmniJobsError):
    """The resource does not exist or belongs to another tenant (indistinguishable)."""

    http_status = 404
    error_type = "invalid_request_error"
    code = "not_found"


class Conflict(OmniJobsError):
    """The resource is in a state that forbids the operation (e.g. content of a queued job)."""

    http_status = 409
    error_type = "invalid_request_error"
    code = "conflict"


class SignatureInvalid(OmniJobsError):
    """A locally signed object URL is expired or tampered with."""

    http_status = 403
    error_type = "invalid_request_error"
    code = "signature_invalid"


class RangeNotSatisfiable(OmniJobsError):
    """A download's ``Range`` lies past the end of the object (sent with ``Content-Range:
    bytes */<size>``)."""

    http_status = 416
    error_type = "invalid_request_error"
    code = "range_not_satisfiable"


class ServiceUnavailable(OmniJobsError):
    """A dependency (database, broker, object store) is unreachable right now."""

    http_status = 503
    error_type = "server_error"
    code = "service_unavailable"
    retryable = True
    retry_after_s = 2


class PayloadTooLarge(OmniJobsError):
    """A request body is over its route's limit; the rest of it is never read."""

    http_status = 413
    error_type = "invalid_request_error"
    code = "request_too_large"


class TooManyRequests(OmniJobsError):
    """A quota or rate limit refused a submit; nothing was stored. ``code`` says which
    (``too_many_active_jobs``, ``queue_full``, ``rate_limit_exceeded``)."""

    http_status = 429
    error_type = "rate_limit_error"
    code = "rate_limit_exceeded"
    retryable = True
    retry_after_s = 1


class ResultUnavailable(OmniJobsError):
    """A job the caller waited on completed but its bytes could not be read right now.

    Not retryable: a resubmit would render the same text again; the job's content is
    fetched later with ``GET /v1/jobs/{id}/content``.
    """

    http_status = 503
    error_type = "server_error"
    code = "result_unavailable"


class OutputExpired(OmniJobsError):
    """The output's retention period (``OMNIJOBS_OUTPUT_TTL_S``) has passed; its bytes are
    deleted, the job's record stays."""

    http_status = 410
    error_type = "invalid_request_error"
    code = "output_expired"


class ConfigurationError(OmniJobsError):
    """Settings are unusable (e.g. placeholder secrets outside the embedded mode)."""

    code = "configuration_error"


class EngineStartTimeout(OmniJobsError):
    """The inference engine did not start within its start-up bounds. A cold cache or a
    slow volume can cause it, so the worker exits for a fresh start (tasks/exit_codes)."""

    code = "engine_start_timeout"


# ---- files and batches ---------------------------------------------------------------

class FileTooLarge(OmniJobsError):
    """An uploaded file is over its limit (a batch input: ``OMNIJOBS_BATCH_MAX_FILE_BYTES``).
    Nothing is stored."""

    http_status = 413
    error_type = "invalid_request_error"
    code = "file_too_large"


class StorageQuotaExceeded(OmniJobsError):
    """An upload would take the tenant's files past ``OMNIJOBS_TENANT_STORAGE_BYTES``.
    Nothing is stored. A 413, not a 429: waiting does not help, deleting files does."""

    http_status = 413
    error_type = "invalid_request_error"
    code = "storage_quota_exceeded"


class FileExpired(OmniJobsError):
    """The file is past its ``expires_at``: its bytes are deleted, its record stays."""

    http_status = 410
    error_type = "invalid_request_error"
    code = "file_expired"


class BatchQuotaExceeded(OmniJobsError):
    """The tenant already has as many unfinished batches, or queued batch requests, as its
    bulk quota allows (separate from the interactive quotas). Nothing was stored."""

    http_status = 429
    error_type = "rate_limit_error"
    code = "batch_quota_exceeded"
    retryable = True


# ---- job failures (workers; recorded on the job as its reason) ---------------------

class JobFailure(OmniJobsError):
    """A job could not be produced. Recorded as ``failed`` with ``code`` and message."""

    code = "job_failed"


class OutputInvalid(JobFailure):
    """Generated media broke an assembly or validation rule (silent, empty, NaN, ...).

    Not retryable: the same request would most likely produce the same result.
    """

    code = "output_invalid"


class EncodingFailed(JobFailure):
    """Encoding/muxing failed or the encoded bytes did not probe as expected."""

    code = "encoding_failed"


class PipelineFailed(JobFailure):
    """The model pipeline raised. Retryable: engines fail transiently (OOM, restarts)."""

    code = "pipeline_error"
    retryable = True


class EngineRejected(JobFailure):
    """The inference engine refused the request itself (vLLM-Omni's ``OmniClientError``,
    a 4xx-class problem such as a guardrail or an unsupported shape), or vLLM-Omni's own
    request builder could not make it (``cfg_unavailable``: no guidance null prompt
    matches the input's length). Not retryable: the same request is refused again. The
    message carries the engine's own words, clipped."""

    code = "engine_rejected"


class StorageFailed(JobFailure):
    """The object store refused or could not be reached. Retryable."""

    code = "storage_error"
    retryable = True


class JobCancelled(JobFailure):
    """The job was cancelled while running; the worker stops and records nothing."""

    code = "cancelled"


class RenderFailed(OmniJobsError):
    """A job the caller waited on synchronously ended ``failed``; carries the job's reason."""

    http_status = 500
    error_type = "server_error"
    code = "job_failed"


class EngineDead(PipelineFailed):
    """The inference engine died. The job is retried elsewhere and this worker process
    restarts rather than poisoning later jobs with a broken engine."""

    code = "engine_dead"


class DeadlineExceeded(JobFailure):
    """The job ran past the maximum run time its caller set (``max_run_s``): it ends
    ``cancelled`` with this code, never retried (the caller's bound, not the engine's)."""

    code = "deadline_exceeded"


class JobTimedOut(PipelineFailed):
    """The job ran past its pipeline's maximum runtime. Retryable (a hung engine may be
    transient); the worker process is recycled so the stuck call cannot block the next job."""

    code = "timeout"
