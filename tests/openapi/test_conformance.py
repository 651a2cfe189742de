"""The checker itself: it finds what the pinned document forbids, lets through only the
listed deviations, and its pinned extract is what OpenAI published."""

from __future__ import annotations

import fnmatch
import json

import pytest

from . import conformance
from .extract import PATHS

VIDEO = {"id": "video_1", "object": "video", "model": "reference-t2va", "status": "queued",
         "progress": 0, "created_at": 1, "completed_at": None, "expires_at": None,
         "prompt": "p", "size": "1280x720", "seconds": "4", "remixed_from_video_id": None,
         "error": None, "resolution": "448x256"}


def problems(body: dict, method: str = "GET", path: str = "/v1/videos/video_1",
             status: int = 200, ctype: str = "application/json") -> list[str]:
    return conformance.check(method, path, status, ctype, json.dumps(body).encode())


def test_a_conformant_video_passes_and_extra_fields_are_allowed():
    assert problems(VIDEO) == []


@pytest.mark.parametrize(("change", "found"), [
    ({"remixed_from_video_id": ...}, "'remixed_from_video_id' is a required property"),
    ({"status": "cancelled"}, "status: 'cancelled' is not one of"),
    ({"size": "448x256"}, "size: '448x256' is not one of"),
    ({"error": {"message": "no code"}}, "error: 'code' is a required property"),
])
def test_what_the_service_once_answered_is_caught(change, found):
    body = {k: v for k, v in {**VIDEO, **change}.items() if v is not ...}
    assert any(found in p for p in problems(body)), problems(body)


def test_lists_are_checked_item_by_item():
    page = {"object": "list", "data": [VIDEO, {**VIDEO, "status": "cancelled"}],
            "first_id": "video_1", "last_id": "video_1", "has_more": False}
    assert [p.split(": ", 1)[1] for p in problems(page, path="/v1/videos")] == [
        "data/1/status: 'cancelled' is not one of "
        "['queued', 'in_progress', 'completed', 'failed']"]


def test_errors_are_held_to_openais_error_shape():
    ok = {"error": {"message": "m", "type": "invalid_request_error", "param": None,
                    "code": "x"}}
    assert problems(ok, status=400) == []
    assert problems({"error": {"message": "m"}}, status=400)
    assert conformance.check("GET", "/v1/videos/v", 500, "text/plain", b"boom")


def test_content_types_are_the_documents_or_a_listed_deviation():
    assert conformance.check("GET", "/v1/files/f/content", 200, "application/json",
                             b"{}\n{}\n") == []
    assert conformance.check("GET", "/v1/files/f/content", 200, "application/jsonl", b"")
    assert conformance.check("GET", "/v1/videos/v/content", 200, "image/webp", b"") == []
    assert conformance.check("GET", "/v1/videos/v/content", 200, "image/jpeg", b"")
    assert conformance.check("POST", "/v1/audio/speech", 200, "audio/mpeg", b"") == []


def test_deviations_are_narrow():
    """A listed deviation lets through exactly its value on its routes."""
    batch = {"id": "b", "object": "batch", "endpoint": "/v1/audio/speech",
             "input_file_id": "f", "completion_window": "24h", "status": "validating",
             "created_at": 1, "output_file_id": None,
             "request_counts": {"total": 0, "completed": 0, "failed": 0}}
    assert problems(batch, path="/v1/batches/b") == []
    assert problems({**batch, "output_file_id": 7}, path="/v1/batches/b")
    assert problems({**batch, "status": "paused"}, path="/v1/batches/b")
    speech_sse = b'data: {"type": "speech.audio.done", "usage": {}}\n\n'
    assert conformance.check("POST", "/v1/audio/speech", 200, "text/event-stream", speech_sse)


def test_every_deviation_has_a_reason_and_a_route():
    routes = [f"{m.upper()} /v1{p}" for p, item in conformance.spec()["paths"].items()
              for m in item]
    for dev in conformance.DEVIATIONS:
        assert len(dev.reason) > 40, dev
        assert any(fnmatch.fnmatchcase(r, dev.operation) for r in routes), dev


def test_the_pinned_extract_is_openais_document_at_its_commit():
    doc = conformance.spec()
    assert doc["info"]["version"] == "2.3.0"
    assert "f85dbe223d40e1a31cba812ab2d755c7e98a92a3" in doc["info"]["x-source"]
    assert set(doc["paths"]) == set(PATHS)
    assert (conformance.SPEC_FILE.parent / "LICENSE").read_text().startswith("The MIT License")
    status = doc["components"]["schemas"]["VideoStatus"]["enum"]
    assert status == ["queued", "in_progress", "completed", "failed"]
