"""Wire models: ``XCreate`` for requests, ``XPublic`` for responses (the job and video
objects live in ``storage.views``, shared with webhooks, batches and event streams)."""

from __future__ import annotations

from typing import Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from storage.views import JobError, JobPublic, OutputPublic, VideoPublic

__all__ = ["JobError", "JobPublic", "OutputPublic", "VideoPublic"]  # re-exported

Item = TypeVar("Item")
ResponseFormat = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]
MAX_METADATA_KEYS = 16


def check_metadata(value: dict[str, str] | None) -> dict[str, str] | None:
    """OpenAI's metadata limits: 16 pairs, keys up to 64 and values up to 512 characters."""
    if value is None:
        return None
    if len(value) > MAX_METADATA_KEYS:
        raise ValueError(f"at most {MAX_METADATA_KEYS} metadata pairs are allowed")
    for k, v in value.items():
        if len(k) > 64 or len(v) > 512:
            raise ValueError("metadata keys are limited to 64 and values to 512 characters")
    return value


class SpeechCreate(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1, max_length=200)
    input: str = Field(min_length=1, max_length=4096)
    voice: str | None = Field(default=None, max_length=64)
    response_format: ResponseFormat = "mp3"
    speed: float = Field(default=1.0, ge=0.25, le=4.0)
    instructions: str | None = Field(default=None, max_length=4096)
    stream_format: Literal["audio"] | None = None
    metadata: dict[str, str] | None = None

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

    prompt: str = Field(min_length=1, max_length=10000)
    model: str | None = Field(default=None, min_length=1, max_length=200)
    seconds: float | None = Field(default=None, gt=0, le=600)
    size: str | None = Field(default=None, pattern=r"^\d{1,5}x\d{1,5}$", max_length=11)
    fps: float | None = Field(default=None, gt=0, le=240)
    n: int = Field(default=1, ge=1, le=4)
    seed: int | None = Field(default=None, ge=0, le=2**32 - 1)
    negative_prompt: str | None = Field(default=None, max_length=10000)
    generate_audio: bool | None = None
    guidance_scale: float | None = Field(default=None, ge=0, le=50)
    output_format: Literal["mp4"] = "mp4"
    metadata: dict[str, str] | None = None

    _metadata = field_validator("metadata")(check_metadata)

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
