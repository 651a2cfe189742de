"""Validate a batch's input file and expand it into jobs.

The file is streamed from the store a line at a time. A line that is not a JSON object
(or cannot be parsed at all: nested past the recursion limit, longer than
``OMNIJOBS_BATCH_MAX_LINE_BYTES``), lacks a field, names another URL or repeats a
``custom_id`` fails the whole batch (with up to ``MAX_ERRORS`` errors, each with its line
number) and nothing is created. A line whose body the endpoint refuses becomes a refusal
with the endpoint's own 400 body, and the others go on. Jobs, their render messages and
the refusals are inserted in one transaction, then published in the bulk lane. Whatever
else goes wrong fails the batch with a reason, unless it is an outage (retryable): then
the lease runs out and the step is taken again. No batch stays ``validating`` forever.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from celery import Celery

from core.batches import MAX_CUSTOM_ID, BatchStatus
from core.errors import NotFound, OmniJobsError, ServiceUnavailable, clip
from core.text import refused_character
from storage.objects import ObjectStore
from storage.records import BatchLine, BatchRecord, LineRejected, NewJob

from .lanes import publish_bulk
from .runtime import WorkerRuntime

log = logging.getLogger(__name__)

# (endpoint, tenant id, seed key, body) -> the job, or the endpoint's answer; the API's
# own contract, handed in by the composition root (tasks do not import the API).
LineCheck = Callable[[str, str, str, dict[str, Any]], NewJob | LineRejected]
MAX_ERRORS = 100
LEASE_S = 600.0  # time to start validating (or finalizing) before another process may
REQUIRED = ("custom_id", "method", "url", "body")
MISSING_FILE = {"code": "input_file_not_found", "line": None, "param": None,
                "message": "the input file no longer exists"}


class BatchInvalid(Exception):
    """The input file cannot be used; ``errors`` are OpenAI's ``{code, line, message}``."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__(f"{len(errors)} errors")
        self.errors = errors


class _LineError(Exception):
    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.param = code, message, param

    def entry(self, line: int) -> dict[str, Any]:
        return {"code": self.code, "line": line, "message": self.message, "param": self.param}


@dataclass(frozen=True)
class OverlongLine:
    """A line longer than the cap: only its length was kept, never its bytes."""

    length: int
    limit: int


def split_lines(blocks: Iterable[bytes], max_line_bytes: int
                ) -> Iterator[bytes | OverlongLine]:
    """The lines of a stream of blocks, each byte copied once: a line's pieces are joined
    when it ends (not re-joined with every block, which is quadratic in a long line),
    and dropped as soon as the line passes the cap."""
    pieces: list[bytes] = []
    size = 0
    for block in blocks:
        start = 0
        while (end := block.find(b"\n", start)) != -1:
            yield _whole(pieces, size, block[start:end], max_line_bytes)
            pieces, size, start = [], 0, end + 1
        if start < len(block):
            size += len(block) - start
            pieces = [*pieces, block[start:]] if size <= max_line_bytes else []
    if size:
        yield _whole(pieces, size, b"", max_line_bytes)


def _whole(pieces: list[bytes], size: int, last: bytes, limit: int) -> bytes | OverlongLine:
    if size + len(last) > limit:
        return OverlongLine(size + len(last), limit)
    return b"".join([*pieces, last]) if pieces else last


def stored_lines(store: ObjectStore, key: str, max_line_bytes: int = 1 << 20
                 ) -> Iterator[bytes | OverlongLine]:
    """The file's lines, streamed; a missing file fails the batch."""
    try:
        yield from split_lines(store.stream(key), max_line_bytes)
    except NotFound:
        raise BatchInvalid([MISSING_FILE]) from None


def _decoded(raw: bytes | OverlongLine) -> Any:
    """The line's JSON value; anything the parser raises makes it an invalid line."""
    if isinstance(raw, OverlongLine):
        raise _LineError("line_too_long", f"this line is {raw.length} bytes; lines are "
                         f"limited to {raw.limit} bytes")
    try:
        return json.loads(raw)
    except ValueError:
        raise _LineError("invalid_json_line", "this line is not valid JSON") from None
    except Exception as exc:  # RecursionError (nested too deeply), MemoryError, ...
        raise _LineError("invalid_json_line", "this line cannot be parsed "
                         f"({type(exc).__name__})") from None


def parse_line(raw: bytes | OverlongLine, endpoint: str) -> tuple[str, dict[str, Any]]:
    """(custom_id, body) of one input line, or _LineError."""
    line = _decoded(raw)
    if not isinstance(line, dict):
        raise _LineError("invalid_json_line", "this line is not a JSON object")
    for name in REQUIRED:
        if name not in line:
            raise _LineError("missing_required_parameter", f"missing required field '{name}'",
                             name)
    custom_id, method, url, body = (line[name] for name in REQUIRED)
    if (not isinstance(custom_id, str) or not 1 <= len(custom_id) <= MAX_CUSTOM_ID
            or refused_character(custom_id)):
        raise _LineError("invalid_custom_id", f"custom_id must be a string of 1 to "
                         f"{MAX_CUSTOM_ID} characters, none of them a control character",
                         "custom_id")
    if method != "POST":
        raise _LineError("invalid_method", f"method must be POST (got '{clip(method)}')",
                         "method")
    if url != endpoint:
        raise _LineError("invalid_url", f"url '{clip(url)}' is not the batch's endpoint "
                         f"{endpoint}", "url")
    if not isinstance(body, dict):
        raise _LineError("invalid_body", "body must be a JSON object", "body")
    return custom_id, body


def checked_lines(raw_lines: Iterable[bytes | OverlongLine], batch: BatchRecord,
                  check: LineCheck, max_lines: int) -> Iterator[BatchLine]:
    """Each request as a job or a refusal, in order; raises BatchInvalid at the end if any
    line was unusable (after the first, lines are only checked for more errors)."""
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    index = 0
    for number, raw in enumerate(raw_lines, 1):
        if isinstance(raw, bytes) and not raw.strip():
            continue
        if index == max_lines:
            errors.append(_LineError("too_many_requests", f"a batch holds at most {max_lines}"
                                     " requests").entry(number))
            break
        index += 1
        try:
            custom_id, body = parse_line(raw, batch.endpoint)
            if custom_id in seen:
                raise _LineError("duplicate_custom_id", f"custom_id '{clip(custom_id)}' is "
                                 "used by an earlier line", "custom_id")
            seen.add(custom_id)
            line = None if errors else _checked(check, batch, index - 1, custom_id, body)
        except _LineError as exc:
            errors.append(exc.entry(number))
            if len(errors) == MAX_ERRORS:
                break
            continue
        if line is not None:
            yield line
    if not index and not errors:
        errors.append({"code": "empty_file", "line": None, "param": None,
                       "message": "the input file holds no requests"})
    if errors:
        raise BatchInvalid(errors)


def _checked(check: LineCheck, batch: BatchRecord, index: int, custom_id: str,
             body: dict[str, Any]) -> BatchLine:
    # A video's drawn seed derives from the batch and the request: re-validating after a
    # crash gives the same request, as an Idempotency-Key would.
    try:
        result = check(batch.endpoint, batch.tenant_id, f"{batch.id}\0{custom_id}", body)
    except ServiceUnavailable:
        raise
    except Exception as exc:  # a body that breaks the check is this line's fault alone
        log.warning("batch %s: line check raised", batch.id, exc_info=True)
        raise _LineError("invalid_line", "this line's body cannot be checked "
                         f"({type(exc).__name__})", "body") from None
    if isinstance(result, LineRejected):
        return BatchLine(index=index, custom_id=custom_id, rejected=result)
    return BatchLine(index=index, custom_id=custom_id, job=result)


def _unexpected(exc: Exception) -> list[dict[str, Any]]:
    return [{"code": "validation_failed", "line": None, "param": None,
             "message": f"the batch could not be validated ({type(exc).__name__}); "
                        "nothing was created"}]


def validate_batch(rt: WorkerRuntime, app: Celery, batch_id: str) -> int:
    """validating -> in_progress (every job queued) or failed. Returns 1 if it moved."""
    token = rt.batches.take(batch_id, BatchStatus.VALIDATING, LEASE_S)
    batch = rt.batches.get(batch_id) if token else None
    if batch is None:
        return 0
    if rt.check_line is None:
        raise RuntimeError("this process cannot validate batches (no line check)")
    source = rt.files.get(batch.input_file_id, batch.tenant_id)
    try:
        if source is None:
            raise BatchInvalid([MISSING_FILE])
        queued = rt.batches.expand(batch_id, token, checked_lines(
            stored_lines(rt.store, source.key, rt.settings.batch_max_line_bytes), batch,
            rt.check_line, rt.settings.batch_max_lines))
    except BatchInvalid as exc:
        return int(rt.batches.fail(batch_id, token, exc.errors))
    except Exception as exc:
        if isinstance(exc, OmniJobsError) and exc.retryable:
            raise  # an outage: the lease runs out and the step is taken again
        log.exception("batch %s: validation failed unexpectedly", batch_id)
        return int(rt.batches.fail(batch_id, token, _unexpected(exc)))
    if queued is None:  # cancelled while validating
        return 0
    log.info("batch %s: %d jobs queued", batch_id, len(queued))
    try:
        publish_bulk(app, queued)
    except ServiceUnavailable:
        log.warning("batch %s: broker down; the outbox relay publishes its jobs", batch_id)
        return 1
    rt.batches.mark_published(batch_id)
    return 1

