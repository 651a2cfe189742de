"""Reading a batch input: each line checked as OpenAI's batch line format, every unusable
line reported with its number, the limits, and the endpoint's own contract per body."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from api.batch_lines import line_checker
from core.batches import BatchStatus
from core.jobs import JobKind
from core.settings import Settings
from pipelines import import_pipeline_modules
from storage.records import BatchRecord, LineRejected, NewJob, RequestCounts
from tasks.batch_validate import MAX_ERRORS, BatchInvalid, checked_lines

SPEECH = {"model": "tts-1", "input": "Hello."}
BATCH = BatchRecord(id="batch_x", tenant_id="ten_x", endpoint="/v1/audio/speech",
                    input_file_id="file-x", completion_window="24h",
                    status=BatchStatus.VALIDATING, metadata=None, errors=None,
                    output_file_id=None, error_file_id=None, counts=RequestCounts(),
                    created_at=datetime.now(UTC), expires_at=datetime.now(UTC))


@pytest.fixture(scope="module")
def check():
    import_pipeline_modules()
    return line_checker(Settings(pipelines=["piper-joe", "reference-t2va", "minimax-h3"]))


def raw(custom_id: object = "a", **changes) -> bytes:
    line = {"custom_id": custom_id, "method": "POST", "url": "/v1/audio/speech",
            "body": SPEECH, **changes}
    return json.dumps({k: v for k, v in line.items() if v is not None}).encode()


def errors(lines: list[bytes], check, max_lines: int = 100) -> list[tuple[str, int | None]]:
    with pytest.raises(BatchInvalid) as exc:
        list(checked_lines(lines, BATCH, check, max_lines))
    return [(e["code"], e["line"]) for e in exc.value.errors]


def test_good_and_refused_lines_keep_their_order(check):
    lines = [raw("a"), b"", raw("b", body={"model": "tts-1", "input": "x", "speed": 0.1}),
             b"   ", raw("c")]
    got = list(checked_lines(lines, BATCH, check, 100))
    assert [(x.index, x.custom_id) for x in got] == [(0, "a"), (1, "b"), (2, "c")]
    assert isinstance(got[0].job, NewJob) and got[0].job.kind is JobKind.SPEECH
    assert got[0].job.request == {"input": "Hello.", "response_format": "mp3", "speed": 1.0}
    assert isinstance(got[1].rejected, LineRejected) and got[1].rejected.status_code == 400
    assert got[1].rejected.body["error"]["param"] == "speed"


def test_every_unusable_line_is_reported_with_its_number(check):
    lines = [raw("a"), b"{", b'"text"', raw("b", method="GET"), raw("c", url="/v1/videos"),
             raw("a"), raw(None), raw("d", body=[1]), raw(7), raw("x" * 600),
             raw("f", body=None)]
    assert errors(lines, check) == [
        ("invalid_json_line", 2), ("invalid_json_line", 3), ("invalid_method", 4),
        ("invalid_url", 5), ("duplicate_custom_id", 6), ("missing_required_parameter", 7),
        ("invalid_body", 8), ("invalid_custom_id", 9), ("invalid_custom_id", 10),
        ("missing_required_parameter", 11)]


def test_limits(check):
    assert errors([raw(str(i)) for i in range(4)], check, max_lines=3) == [
        ("too_many_requests", 4)]
    assert len(errors([b"nope"] * (MAX_ERRORS + 50), check)) == MAX_ERRORS
    assert errors([b"", b"\n"], check) == [("empty_file", None)]
    assert errors([b"\xff\xfe"], check) == [("invalid_json_line", 1)]


def test_an_echoed_value_is_cut(check):
    with pytest.raises(BatchInvalid) as exc:
        list(checked_lines([raw(url="/v1/" + "u" * 500)], BATCH, check, 10))
    assert len(exc.value.errors[0]["message"]) < 120


def test_video_lines_draw_a_reproducible_seed(check):
    video = {**BATCH.__dict__, "endpoint": "/v1/videos"}
    batch = BatchRecord(**video)
    body = {"model": "MiniMaxAI/MiniMax-H3", "prompt": "a lighthouse", "seconds": 5,
            "size": "1280x720"}
    line = json.dumps({"custom_id": "clip", "method": "POST", "url": "/v1/videos",
                       "body": body}).encode()
    first = list(checked_lines([line], batch, check, 10))[0].job
    again = list(checked_lines([line], batch, check, 10))[0].job
    assert first.request["seed"] is not None and first.request["seed"] == again.request["seed"]
    other = BatchRecord(**{**video, "id": "batch_y"})
    assert list(checked_lines([line], other, check, 10))[0].job.request["seed"] != \
        first.request["seed"]


def test_a_custom_id_with_a_control_character_is_an_unusable_line(check):
    assert errors([raw("a\x00b"), raw("c\x1b")], check) == [
        ("invalid_custom_id", 1), ("invalid_custom_id", 2)]
