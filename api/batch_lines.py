"""A batch line's body, checked by the contract of the endpoint it names: the same models
and functions the routes use, and the same 400 body they would answer.

The maintenance process validates batches; it is handed ``line_checker(settings)`` by the
composition root, since tasks may not import the API.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from core.errors import InvalidRequest, OmniJobsError
from core.settings import Settings
from storage.records import LineRejected, NewJob

from .deadlines import NAMES as DEADLINES
from .errors import _validation_message, error_body
from .routes.speech import speech_job
from .routes.videos import video_job
from .schemas import SpeechCreate, VideoCreate

# (endpoint, tenant id, seed key, body) -> the job to create, or the endpoint's answer
LineCheck = Callable[[str, str, str, dict[str, Any]], NewJob | LineRejected]
NO_WEBHOOK = ("webhook_url", "webhook_events")


def line_checker(settings: Settings) -> LineCheck:
    def check(endpoint: str, tenant: str, seed_key: str, body: dict[str, Any]
              ) -> NewJob | LineRejected:
        try:
            return _job(settings, endpoint, tenant, seed_key, body)
        except ValidationError as exc:
            message, param = _validation_message(RequestValidationError(exc.errors()))
            return LineRejected(400, error_body(message, "invalid_request_error",
                                                "invalid_request", param))
        except OmniJobsError as exc:
            return LineRejected(exc.http_status, error_body(exc.message, exc.error_type,
                                                            exc.code, exc.param))
    return check


def _job(settings: Settings, endpoint: str, tenant: str, seed_key: str,
         body: dict[str, Any]) -> NewJob:
    for name in NO_WEBHOOK:  # a batch reports through its own batch.* events
        if body.get(name) is not None:
            raise InvalidRequest(f"{name} is not accepted in a batch; register a webhook "
                                 "endpoint for batch events", param=name,
                                 code="unsupported_parameter")
    for name in DEADLINES:  # a batch's requests share its completion_window
        if body.get(name) is not None:
            raise InvalidRequest(f"{name} is not accepted in a batch; the batch's "
                                 "completion_window bounds its requests", param=name,
                                 code="unsupported_parameter")
    if endpoint == "/v1/audio/speech":
        speech = SpeechCreate.model_validate(body)
        spec, fields = speech_job(settings, speech)
        model, metadata = speech.model, speech.metadata
    else:
        video = VideoCreate.model_validate(body)
        spec, model, fields = video_job(settings, video, tenant, seed_key)
        metadata = video.metadata
    return NewJob(tenant_id=tenant, kind=spec.kind, model=model, pipeline=spec.name,
                  queue=spec.queue, request=fields, metadata=metadata,
                  max_attempts=settings.max_attempts)
