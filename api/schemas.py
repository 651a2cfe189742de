"""Wire models: ``XCreate`` for requests, ``XPublic`` for responses (the job and video
objects live in ``storage.views``, shared with webhooks, batches and event streams)."""

from __future__ import annotations

from functools import partial
from typing import Annotated, Generic, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from core.text import check_text
from storage.views import JobError, JobPublic, OutputPublic, VideoPublic

from .deadlines import max_run_field, start_within_field

__all__ = ["JobError", "JobPublic", "OutputPublic", "VideoPublic"]  # re-exported

Item = TypeVar("Item")
ResponseFormat = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]
MAX_METADATA_KEYS = 16
# Every stored string is checked at its schema (core/text.py says why): a name, id, model
# or URL holds no control character at all; prose keeps tabs and line breaks.
Line = Annotated[str, AfterValidator(check_text)]
Prose = Annotated[str, AfterValidator(partial(check_text, prose=True))]


def check_metadata(value: dict[str, str] | None) -> dict[str, str] | None:
    """OpenAI's metadata limits: 16 pairs, keys up to 64 and values up to 512 characters."""
    if value is None:
        return None
    if len(value) > MAX_METADATA_KEYS:
        raise ValueError(f"at most {MAX_METADATA_KEYS} metadata pairs are allowed")
    for k, v in value.items():
        if len(k) > 64 or len(v) > 512:
            raise ValueError("metadata keys are limited to 64 and values to 512 characters")
        check_text(k)
        check_text(v, prose=True)
    return value


class ExpiresAfter(BaseModel):
    """OpenAI's expiration policy of a file: ``seconds`` after its creation, 1 hour to 30
    days."""

    model_config = ConfigDict(extra="forbid")

    anchor: Literal["created_at"]
    seconds: int = Field(ge=3600, le=30 * 86400)


def events_from_form(value):
    """Multipart forms carry a list as a JSON string or comma-separated names."""
    if isinstance(value, str):
        import json

        try:
            return json.loads(value)
        except ValueError:
            return [v.strip() for v in value.split(",") if v.strip()]
    return value


class SpeechCreate(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: Line = Field(min_length=1, max_length=200)
    input: Prose = Field(min_length=1, max_length=4096)
    voice: Line | None = Field(default=None, max_length=64)
    response_format: ResponseFormat = "mp3"
    speed: float = Field(default=1.0, ge=0.25, le=4.0)
    instructions: Prose | None = Field(default=None, max_length=4096)
    stream_format: Literal["audio", "sse"] | None = Field(
        default=None, description="Stream the audio as it is generated: `audio` (the encoded "
        "bytes, chunked) or `sse` (`speech.audio.delta` / `speech.audio.done` events); the "
        "job is still validated, stored and recorded")
    cancel_on_disconnect: bool = Field(
        default=False, description="A streaming client that disconnects cancels the job")
    metadata: dict[str, str] | None = None
    webhook_url: Line | None = Field(default=None, max_length=2048)
    webhook_events: list[str] | None = Field(default=None, max_length=8)
    start_within_s: float | None = start_within_field()
    max_run_s: float | None = max_run_field()

    _metadata = field_validator("metadata")(check_metadata)


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """OpenAI's error shape: every 4xx and 5xx answer has it."""

    error: ErrorDetail


ERROR_RESPONSES: dict[int | str, dict] = {
    status: {"model": ErrorResponse, "description": text} for status, text in (
        (400, "Invalid request"), (401, "Missing or invalid API key"),
        (404, "Not found, or another tenant's"), (413, "Request body too large"),
        (429, "Quota or rate limit reached (see Retry-After)"),
        (503, "A dependency is unavailable (see Retry-After)"))}


class ListPage(BaseModel, Generic[Item]):
    """OpenAI's cursor-paginated list envelope."""

    object: Literal["list"] = "list"
    data: list[Item]
    first_id: str | None
    last_id: str | None
    has_more: bool


def page_of(data: list, has_more: bool) -> dict:
    """A ListPage's fields for one page of public objects."""
    return {"object": "list", "data": data, "first_id": data[0].id if data else None,
            "last_id": data[-1].id if data else None, "has_more": has_more}


JobList = ListPage[JobPublic]


class ModelPublic(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "omnijobs"
    pipeline: str
    kind: str
    max_input_chars: int
    sample_rate: int | None
    max_seconds: float
    voices: list[str] | None
    video: dict | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelPublic]


class VideoCreate(BaseModel):
    """OpenAI Videos create, plus fps, n, seed, negative_prompt, generate_audio."""

    model_config = ConfigDict(extra="forbid")

    prompt: Prose = Field(min_length=1, max_length=10000)
    model: Line | None = Field(default=None, min_length=1, max_length=200)
    seconds: float | None = Field(default=None, gt=0, le=600)
    size: str | None = Field(default=None, pattern=r"^\d{1,5}x\d{1,5}$", max_length=11)
    fps: float | None = Field(default=None, gt=0, le=240)
    n: int = Field(default=1, ge=1, le=4)
    seed: int | None = Field(default=None, ge=0, le=2**32 - 1)
    negative_prompt: Prose | None = Field(default=None, max_length=10000)
    generate_audio: bool | None = None
    guidance_scale: float | None = Field(default=None, ge=0, le=50)
    output_format: Literal["mp4"] = "mp4"
    metadata: dict[str, str] | None = None
    webhook_url: Line | None = Field(default=None, max_length=2048)
    webhook_events: list[str] | None = Field(default=None, max_length=8)
    start_within_s: float | None = start_within_field()
    max_run_s: float | None = max_run_field()

    _metadata = field_validator("metadata")(check_metadata)
    _events = field_validator("webhook_events", mode="before")(events_from_form)

    @field_validator("metadata", mode="before")
    @classmethod
    def _metadata_from_form(cls, value):
        """Multipart forms carry metadata as a JSON string."""
        if isinstance(value, str):
            import json

            try:
                return json.loads(value)
            except (ValueError, RecursionError):  # deep nesting is not a server error
                raise ValueError("metadata must be a JSON object") from None
        return value


def video_form_schema() -> dict:
    """``VideoCreate`` as the multipart form the OpenAI SDK sends: ``metadata`` is JSON
    text there, and a file part (``input_reference``) is refused with a 400."""
    schema = VideoCreate.model_json_schema()
    props = dict(schema["properties"])
    props["metadata"] = {"type": "string", "description": "A JSON object of strings"}
    props["input_reference"] = {"type": "string", "format": "binary",
                                "description": "Not supported: a file part is a 400"}
    return {**schema, "title": "VideoCreateForm", "properties": props}


def video_request_body() -> dict:
    """The OpenAPI request body of ``POST /v1/videos`` (read by the route itself)."""
    form = video_form_schema()
    fields = {k: v for k, v in form["properties"].items() if k != "input_reference"}
    return {"requestBody": {"required": True, "content": {
        "application/json": {"schema": VideoCreate.model_json_schema()},
        "multipart/form-data": {"schema": form},
        "application/x-www-form-urlencoded": {"schema": {**form, "properties": fields}}}}}


VideoList = ListPage[VideoPublic]


class VideoDeleted(BaseModel):
    id: str
    object: Literal["video.deleted"] = "video.deleted"
    deleted: bool = True


# ---- webhooks ----------------------------------------------------------------------

class WebhookEndpointCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Line = Field(min_length=1, max_length=256)
    url: Line = Field(min_length=1, max_length=2048)
    event_types: list[str] = Field(min_length=1, max_length=32)


class WebhookEndpointUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Line | None = Field(default=None, min_length=1, max_length=256)
    url: Line | None = Field(default=None, min_length=1, max_length=2048)
    event_types: list[str] | None = Field(default=None, min_length=1, max_length=32)


class WebhookEndpointPublic(BaseModel):
    """OpenAI's webhook_endpoint object (``disabled_at`` is ours: set after a 410)."""

    id: str
    object: Literal["webhook_endpoint"] = "webhook_endpoint"
    name: str
    url: str
    event_types: list[str]
    created_at: int
    updated_at: int
    signing_secret_hint: str
    disabled_at: int | None = None


class WebhookEndpointWithSecret(WebhookEndpointPublic):
    signing_secret: str


class WebhookEndpointDeleted(BaseModel):
    id: str
    object: Literal["webhook_endpoint.deleted"] = "webhook_endpoint.deleted"
    deleted: bool = True


class WebhookRotateSecret(BaseModel):
    keep_old_secret_active_for_24_hours: bool = False


class WebhookTest(BaseModel):
    event_type: str = Field(max_length=64)


class WebhookTestResult(BaseModel):
    object: Literal["webhook_endpoint.test"] = "webhook_endpoint.test"
    status_code: int
    success: Literal[True] = True
    event_type: str
    webhook_endpoint_id: str


class WebhookSecretPublic(BaseModel):
    object: Literal["webhook_secret"] = "webhook_secret"
    secret: str
    created_at: int
    previous_secret_expires_at: int | None


class WebhookAttemptPublic(BaseModel):
    attempted_at: int
    url_host: str
    status_code: int | None
    error: str | None
    duration_ms: int
    next_attempt_at: int | None


class WebhookDeliveryPublic(BaseModel):
    id: str
    object: Literal["webhook_delivery"] = "webhook_delivery"
    event_id: str
    event_type: str
    webhook_endpoint_id: str | None
    status: Literal["pending", "succeeded", "failed", "stopped"]
    next_attempt_at: int | None
    created_at: int
    attempts: list[WebhookAttemptPublic]


class WebhookDeliveryList(BaseModel):
    object: Literal["list"] = "list"
    data: list[WebhookDeliveryPublic]


class EventTypeList(BaseModel):
    object: Literal["list"] = "list"
    data: list[str]
