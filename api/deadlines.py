"""A job's deadlines, from its request: ``start_within_s`` (it must have started that
many seconds after submit, else it ends ``expired`` without running; RunPod's TTL) and
``max_run_s`` (each attempt runs at most that long, else the job ends ``cancelled`` with
``deadline_exceeded``; RunPod's execution timeout, Replicate's ``Cancel-After``). The
``Cancel-After`` header is accepted for ``max_run_s`` in Replicate's duration syntax."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from pydantic import Field

from core.errors import InvalidRequest, clip
from core.settings import Settings
from pipelines import PipelineSpec
from storage.records import Deadlines

MAX_START_WITHIN_S = 7 * 86400.0


def start_within_field():
    return Field(default=None, gt=0, le=MAX_START_WITHIN_S, description=(
        "Seconds from submit by which the job must have started; if it has not, it ends "
        "`expired` (on /v1/videos: `failed`, code `start_deadline_exceeded`) and never "
        "runs"))


def max_run_field():
    return Field(default=None, gt=0, le=86400, description=(
        "The most seconds an attempt may run (at most the pipeline's maximum runtime); "
        "past it the job ends `cancelled` with code `deadline_exceeded` (on /v1/videos: "
        "`failed`). Also the `Cancel-After` header (`30s`, `5m`, `1h30m`)"))


NAMES = ("start_within_s", "max_run_s")  # the request fields that are not the pipeline's
_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m(?!s))?"
                       r"(?:(\d+(?:\.\d+)?)s)?(?:(\d+(?:\.\d+)?)ms)?")


def cancel_after_s(header: str | None) -> float | None:
    """``Cancel-After``: a duration (``90s``, ``5m``, ``1h30m``, ``500ms``) or seconds."""
    if header is None:
        return None
    text = header.strip()
    try:
        return float(text)
    except ValueError:
        pass
    match = _DURATION.fullmatch(text)
    if not text or match is None:
        raise InvalidRequest(f"Cancel-After must be a duration such as 30s, 5m or 1h30m "
                             f"(got {clip(header)})", param="Cancel-After")
    h, m, s, ms = (float(g) if g else 0.0 for g in match.groups())
    return h * 3600 + m * 60 + s + ms / 1000


def runtime_limit_s(settings: Settings, spec: PipelineSpec) -> float:
    """The pipeline's maximum runtime, as its workers apply it."""
    return float(settings.pipeline_options.get(spec.name, {}).get(
        "max_runtime_s", spec.runtime_limit_s))


def deadlines(settings: Settings, spec: PipelineSpec, start_within_s: float | None,
              max_run_s: float | None, cancel_after: str | None = None) -> Deadlines | None:
    """The job's deadlines (None when it has none), or InvalidRequest naming the field."""
    header = cancel_after_s(cancel_after)
    if header is not None:
        if max_run_s is not None and header != max_run_s:
            raise InvalidRequest("Cancel-After and max_run_s disagree; send one",
                                 param="Cancel-After")
        if not 0 < header <= 86400:
            raise InvalidRequest("Cancel-After must be more than 0 and at most 24 hours",
                                 param="Cancel-After")
        max_run_s = header
    limit = runtime_limit_s(settings, spec)
    if max_run_s is not None and max_run_s > limit:
        raise InvalidRequest(f"max_run_s is {clip(max_run_s)}; the pipeline's maximum "
                             f"runtime is {limit:g} s", param="max_run_s")
    if start_within_s is None and max_run_s is None:
        return None
    start_by = (datetime.now(UTC) + timedelta(seconds=start_within_s)
                if start_within_s is not None else None)
    return Deadlines(start_by=start_by, max_run_s=max_run_s)
