"""Files and Batches through the official openai SDK, unmodified: speech and video batches
end to end, each result line the job or video exactly as GET shows it, and the batch's
webhook event."""

from __future__ import annotations

import hashlib
import io

import httpx
import openai
import pytest

from ..webhooks.receiver import verify
from .conftest import MAX_FILE_BYTES, jsonl, results, speech_line, video_line, wait_batch

SIGNED = ("url", "url_expires_at")


def without_signatures(resource: dict) -> dict:
    """A resource minus what each GET signs afresh."""
    outputs = [{k: v for k, v in o.items() if k not in SIGNED} for o in resource["outputs"]]
    return {**resource, "outputs": outputs}


def test_files_api(sdk, client):
    made = sdk.files.create(file=("requests.jsonl", io.BytesIO(b'{"a": 1}\n')),
                            purpose="batch")
    assert (made.object, made.purpose, made.bytes, made.filename) == (
        "file", "batch", 9, "requests.jsonl")
    assert sdk.files.retrieve(made.id).id == made.id
    assert sdk.files.content(made.id).content == b'{"a": 1}\n'
    assert made.id in [f.id for f in sdk.files.list(purpose="batch")]
    assert sdk.files.delete(made.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        sdk.files.retrieve(made.id)
    assert client.get(f"/v1/files/{made.id}/content").status_code == 404


def test_file_uploads_are_checked(sdk, client):
    before = [f.id for f in sdk.files.list()]
    with pytest.raises(openai.BadRequestError, match="purpose"):
        sdk.files.create(file=("a.jsonl", io.BytesIO(b"{}\n")), purpose="fine-tune")
    big = io.BytesIO(b"x" * (MAX_FILE_BYTES + 1))
    with pytest.raises(openai.APIStatusError) as exc:
        sdk.files.create(file=("big.jsonl", big), purpose="batch")
    assert exc.value.status_code == 413
    assert exc.value.body["code"] == "file_too_large"
    missing = client.post("/v1/files", data={"purpose": "batch"},
                          files={"other": ("a.jsonl", b"{}")})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "file"
    assert [f.id for f in sdk.files.list()] == before  # nothing stored by a refusal


def test_speech_batch_through_the_sdk(sdk, client, receiver):
    endpoint = sdk.webhooks.create(name="batches", url=receiver.url("/batch-events"),
                                   event_types=["batch.completed"])
    lines = [speech_line(f"narration-{i}", input=f"Chapter {i} begins here.")
             for i in range(3)]
    source = sdk.files.create(file=("narration.jsonl", io.BytesIO(jsonl(lines))),
                              purpose="batch")
    batch = sdk.batches.create(input_file_id=source.id, endpoint="/v1/audio/speech",
                               completion_window="24h", metadata={"book": "one"})
    assert batch.status == "validating" and batch.metadata == {"book": "one"}
    done = wait_batch(sdk, batch.id)
    assert done.status == "completed", done
    assert (done.request_counts.total, done.request_counts.completed,
            done.request_counts.failed) == (3, 3, 0)
    assert done.error_file_id is None and done.in_progress_at and done.completed_at
    out = results(sdk, done.output_file_id)
    assert [line["custom_id"] for line in out] == [f"narration-{i}" for i in range(3)]
    for line in out:
        assert line["error"] is None and line["response"]["status_code"] == 200
        body = line["response"]["body"]
        assert line["response"]["request_id"] == body["id"]
        shown = client.get(f"/v1/jobs/{body['id']}").json()
        assert without_signatures(body) == without_signatures(shown)
        assert body["status"] == "completed" and body["outputs"][0]["content_type"] == "audio/wav"
        data = httpx.get(body["outputs"][0]["url"]).content  # the signed URL itself
        assert hashlib.sha256(data).hexdigest() == body["outputs"][0]["sha256"]
    event = verify(receiver.wait_for("/batch-events")[0], endpoint.signing_secret)
    assert event["type"] == "batch.completed"
    assert event["data"] == client.get(f"/v1/batches/{batch.id}").json()  # as GET shows it
    assert event["data"]["request_counts"] == {"total": 3, "completed": 3, "failed": 0}


def test_video_batch_through_the_sdk(sdk, client):
    lines = [video_line("two-takes", n=2, seed=3), video_line("one-take", seed=4)]
    source = sdk.files.create(file=("clips.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    batch = sdk.batches.create(input_file_id=source.id, endpoint="/v1/videos",
                               completion_window="24h")
    done = wait_batch(sdk, batch.id)
    assert done.status == "completed", done
    assert done.request_counts.completed == 2
    out = {line["custom_id"]: line["response"]["body"] for line in results(
        sdk, done.output_file_id)}
    assert out["two-takes"]["object"] == "video" and out["two-takes"]["n"] == 2
    assert len(out["two-takes"]["outputs"]) == 2 and len(out["one-take"]["outputs"]) == 1
    for body in out.values():
        shown = client.get(f"/v1/videos/{body['id']}").json()
        assert without_signatures(body) == without_signatures(shown)
        assert sdk.videos.retrieve(body["id"]).status == "completed"
