"""The public usage objects: a job's or a batch's ``usage``, and ``GET /v1/usage``'s
page of time buckets (the shape of OpenAI's organization usage endpoints)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from .records import UsageRecord


class UsagePublic(BaseModel):
    """What a finished job cost (for a batch: the sum over its finished jobs)."""

    render_seconds: float = Field(description="The workers' wall time in the pipeline, "
                                  "every attempt's (generation, encoding, upload)")
    failed_render_seconds: float = Field(description="The part of render_seconds spent in "
                                         "attempts that produced nothing (retried, failed, "
                                         "timed out, cancelled): not billed as output")
    attempts: int
    device: str | None = Field(default=None, description="Where the last attempt ran: "
                               "`cpu`, or `cuda:N (GPU model)`; null for sums")
    characters: int = Field(description="Characters of input text (speech input or prompt)")
    audio_seconds: float
    video_seconds: float
    frames: int
    bytes: int


def usage_view(u: UsageRecord | None) -> UsagePublic | None:
    if u is None:
        return None
    return UsagePublic(render_seconds=u.render_s, failed_render_seconds=u.failed_render_s,
                       attempts=u.attempts, device=u.device, characters=u.characters,
                       audio_seconds=u.audio_s, video_seconds=u.video_s, frames=u.frames,
                       bytes=u.bytes)


OUTPUT_TOKENS_PER_S = 50  # one output token per 20 ms of audio (as speech.audio.done)


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class BatchTokenUsage(BaseModel):
    """OpenAI's batch ``usage`` (tokens), in this service's units: input tokens are the
    input's characters, output tokens the audio's 20 ms frames. What the batch cost in
    render time is ``render_usage`` beside it."""

    input_tokens: int = 0
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int = 0
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int = 0


def token_usage(u: UsageRecord | None) -> BatchTokenUsage:
    if u is None:
        return BatchTokenUsage()
    out = round(u.audio_s * OUTPUT_TOKENS_PER_S)
    return BatchTokenUsage(input_tokens=u.characters, output_tokens=out,
                           total_tokens=u.characters + out)


class UsageResult(UsagePublic):
    object: Literal["organization.usage.render.result"] = "organization.usage.render.result"
    num_jobs: int = Field(description="Jobs that ended in the bucket")
    num_completed_jobs: int
    model: str | None = None
    pipeline: str | None = None
    batch_id: str | None = None


class UsageBucket(BaseModel):
    object: Literal["bucket"] = "bucket"
    start_time: int
    end_time: int
    results: list[UsageResult]


class UsagePage(BaseModel):
    object: Literal["page"] = "page"
    data: list[UsageBucket]
    has_more: bool
    next_page: str | None


def usage_page(rows: list, start: int, end: int, width_s: int, limit: int) -> UsagePage:
    """Every bucket of ``[start, end)`` up to ``limit`` of them (empty ones too, as
    OpenAI lists them), each with its groups' results; ``next_page`` is the next
    bucket's start while buckets remain. ``rows``: UsageBucketRow of those buckets."""
    by_start: dict[int, list[UsageResult]] = {}
    for r in rows:
        u = usage_view(r.usage)
        by_start.setdefault(r.start, []).append(UsageResult(
            **u.model_dump(exclude={"device"}), num_jobs=r.usage.jobs,
            num_completed_jobs=r.usage.completed, **r.group))
    stop = min(end, start + limit * width_s)
    data = [UsageBucket(start_time=t, end_time=min(t + width_s, end),
                        results=by_start.get(t, []))
            for t in range(start, stop, width_s)]
    more = stop < end
    return UsagePage(data=data, has_more=more, next_page=str(stop) if more else None)
