"""Responses of the OpenAI-compatible routes, checked against OpenAI's published OpenAPI
document (the pinned extract beside this file, openai/openai-openapi at f85dbe2, 2.3.0).

``check`` validates one response: a JSON body against the operation's schema (an error
status against OpenAI's ``ErrorResponse``), an event stream event by event, and any
other body by its content type. ``DEVIATIONS`` is the one list of what the service
answers differently on purpose, each with its reason; nothing else is tolerated.
"""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

SPEC_FILE = Path(__file__).resolve().parent / "openai-openapi-f85dbe2.json"
BASE = "urn:openai-openapi"
PREFIX = "/v1"


@dataclass(frozen=True)
class Deviation:
    """One deliberate difference: on the operations matching ``operation`` (a glob over
    ``"GET /v1/batches/{batch_id}"``), either a schema error at an instance path matching
    ``field`` (a glob over the "/"-joined path) whose value is one of ``values``, a
    ``content_type`` (a glob) or a ``status`` the spec does not list."""

    operation: str
    reason: str
    field: str | None = None
    values: tuple = ()
    content_type: str | None = None
    status: int | None = None


BATCH_UNSET = ("output_file_id", "error_file_id", "errors", "in_progress_at", "expires_at",
               "finalizing_at", "completed_at", "failed_at", "expired_at", "cancelling_at",
               "cancelled_at")
DEVIATIONS: tuple[Deviation, ...] = (
    *(Deviation("* /v1/batches*", field=f, values=(None,), reason=(
        "a batch's fields not yet set are null, as OpenAI's own API answers and its SDK "
        "types them (Optional); the document types them non-null")) for f in
      (*BATCH_UNSET, *(f"data/*/{f}" for f in BATCH_UNSET))),
    *(Deviation("GET /v1/*", field=f, values=(None,), reason=(
        "an empty page has no first or last id: null, as OpenAI's own API answers; the "
        "document types them as strings")) for f in ("first_id", "last_id")),
    Deviation("POST /v1/audio/speech", status=202, reason=(
        "speech not ready within the wait (`Prefer: respond-async`, or a wait that ran "
        "out) answers 202 with the job to poll (docs/api.md); OpenAI's API always waits")),
    Deviation("POST /v1/audio/speech", content_type="audio/*", reason=(
        "speech is served with its format's own type (audio/mpeg, audio/wav, ...), as "
        "OpenAI's API does; the document lists only application/octet-stream")),
    Deviation("POST /v1/audio/speech", field="(event)", values=("error",), reason=(
        "a speech stream that cannot end whole (the job failed after its first audio) ends "
        "with an `error` event, so a client never takes a cut stream for a whole one; the "
        "document has no error event for speech")),
    Deviation("* /v1/files*", field="*status", values=("expired",), reason=(
        "a file past its expires_at keeps its record and says so (DECISIONS.md, Files "
        "expire); the document's three statuses have no word for it")),
)


@cache
def spec() -> dict:
    return json.loads(SPEC_FILE.read_text())


@cache
def _registry() -> Registry:
    return Registry().with_resource(BASE, Resource(spec(), DRAFT202012))


@cache
def _validator(pointer: str) -> Draft202012Validator:
    return Draft202012Validator({"$ref": f"{BASE}#{pointer}"}, registry=_registry())


def _escape(part: str) -> str:
    return part.replace("~", "~0").replace("/", "~1")


@cache
def _routes() -> tuple[tuple[str, re.Pattern, str], ...]:
    routes = []
    for template, item in spec()["paths"].items():
        pattern = re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(PREFIX + template))
        for method in item:
            routes.append((method.upper(), re.compile(pattern + "$"), template))
    # literal segments first: /v1/videos/edits is not /v1/videos/{video_id}
    return tuple(sorted(routes, key=lambda r: r[2].count("{")))


def operation(method: str, path: str) -> str | None:
    """The spec's path template for a request (None: not an OpenAI route)."""
    for verb, pattern, template in _routes():
        if verb == method.upper() and pattern.match(path):
            return template
    return None


def _allowed(op: str, field: str | None = None, value=None, content_type: str | None = None,
             status: int | None = None) -> bool:
    for dev in DEVIATIONS:
        if not fnmatch.fnmatchcase(op, dev.operation):
            continue
        if status is not None and dev.status == status:
            return True
        if content_type is not None and dev.content_type is not None \
                and fnmatch.fnmatchcase(content_type, dev.content_type):
            return True
        if field is not None and dev.field is not None \
                and fnmatch.fnmatchcase(field, dev.field) and value in dev.values:
            return True
    return False


def _schema_problems(pointer: str, body, op: str) -> list[str]:
    problems = []
    for error in _validator(pointer).iter_errors(body):
        for leaf in _leaves(error):
            field = "/".join(str(p) for p in leaf.absolute_path)
            if not _allowed(op, field, leaf.instance):
                problems.append(f"{field or '(body)'}: {leaf.message}"[:300])
    return problems


def _leaves(error) -> list:
    """The innermost errors of an anyOf/oneOf (``null`` not matching a nullable field's
    first branch is one branch's complaint, not a problem by itself)."""
    if error.context and error.validator in ("anyOf", "oneOf"):
        best = {}
        for sub in error.context:
            best.setdefault(sub.relative_schema_path[0], []).extend(_leaves(sub))
        # the branch that came closest: fewest complaints
        return min(best.values(), key=len)
    return [error]


def check(method: str, path: str, status: int, content_type: str, body: bytes) -> list[str]:
    """What is wrong with this response (empty: it conforms, or it is no OpenAI route)."""
    template = operation(method, path)
    if template is None:
        return []
    op = f"{method.upper()} {PREFIX}{template}"
    media = content_type.split(";")[0].strip().lower()
    where = f"{op} -> {status} {media}"
    if status >= 400:
        if media != "application/json":
            return [f"{where}: an error is not OpenAI's JSON error shape"]
        return [f"{where}: {p}" for p in _schema_problems(
            "/components/schemas/ErrorResponse", json.loads(body), op)]
    responses = spec()["paths"][template][method.lower()]["responses"]
    declared = responses.get(str(status))
    if declared is None:
        if _allowed(op, status=status):
            return []
        return [f"{where}: status {status} is not one the document lists ({sorted(responses)})"]
    content = declared.get("content", {})
    if media not in content:
        if _allowed(op, content_type=media):
            return []
        return [f"{where}: content type not one the document lists ({sorted(content)})"]
    pointer = "/".join(("/paths", _escape(template), method.lower(), "responses",
                        str(status), "content", _escape(media), "schema"))
    return [f"{where}: {p}" for p in _body_problems(pointer, content[media], media, body, op)]


def _body_problems(pointer: str, declared: dict, media: str, body: bytes, op: str
                   ) -> list[str]:
    if declared.get("schema", {}).get("type") == "string":  # bytes: the type is the check
        return []
    if media == "application/json":
        try:
            payload = json.loads(body)
        except ValueError:
            return ["body is not JSON"]
        return _schema_problems(pointer, payload, op)
    if media == "text/event-stream":
        return _event_problems(pointer, body, op)
    return []


def _event_problems(pointer: str, body: bytes, op: str) -> list[str]:
    problems = []
    for line in body.decode("utf-8", "replace").splitlines():
        if line.startswith("data:"):
            event = json.loads(line[5:])
            if _allowed(op, "(event)", event.get("type")):
                continue
            problems += _schema_problems(pointer, event, op)
    return problems
