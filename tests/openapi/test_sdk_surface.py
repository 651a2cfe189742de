"""Each OpenAI route through the official openai SDK against a real deployment (API,
worker, maintenance; PostgreSQL, Redis, SeaweedFS). Every response read here is also
checked against OpenAI's published document by the suite's recorder (tests/conftest.py);
these tests assert what the document cannot: that the values are true."""

from __future__ import annotations

import hashlib
import io
import json
import math
import time

import openai
import pytest
from openai import OpenAI

from media.preview import decode_image
from media.probe import probe_video

from . import conformance

PROMPT = "A lighthouse at dusk, waves rolling in."


@pytest.fixture(scope="module")
def key(stack) -> str:
    return stack.new_key("openai-surface")


@pytest.fixture(scope="module")
def sdk(stack, key) -> OpenAI:
    return OpenAI(base_url=f"{stack.base_url}/v1", api_key=key, max_retries=0)


@pytest.fixture(scope="module")
def client(stack, key):
    with stack.client(key) as c:
        yield c


@pytest.fixture(scope="module")
def video(sdk):
    """One finished prompt-only video of the reference model (448x256 by default)."""
    done = sdk.videos.create_and_poll(model="reference-t2va", prompt=PROMPT, seconds="1")
    assert done.status == "completed", done
    return done


def test_a_prompt_only_video_reports_an_openai_size_and_its_real_resolution(video):
    raw = video.model_dump()
    assert raw["size"] == "1280x720" and raw["resolution"] == "448x256"
    assert raw["remixed_from_video_id"] is None and raw["error"] is None
    [out] = raw["outputs"]
    assert (out["width"], out["height"]) == (448, 256)


def test_thumbnail_and_spritesheet_are_stills_of_the_stored_video(sdk, client, video):
    mp4 = sdk.videos.download_content(video.id).read()
    probe = probe_video(mp4)
    thumb = sdk.videos.download_content(video.id, variant="thumbnail")
    sheet = sdk.videos.download_content(video.id, variant="spritesheet")
    for resp in (thumb, sheet):
        assert resp.response.headers["content-type"] == "image/webp"
        sha = resp.response.headers["x-content-sha256"]
        assert hashlib.sha256(resp.content).hexdigest() == sha
    still = decode_image(thumb.content)
    assert still.shape == (probe.height, probe.width, 3)
    grid = decode_image(sheet.content)
    columns = math.ceil(math.sqrt(min(probe.frames, 16)))
    assert grid.shape[1] == columns * min(probe.width, 256)
    assert still.std() > 1 and grid.std() > 1  # real frames, not a blank canvas
    # /v1/jobs lists the video itself, not its previews
    assert [o["index"] for o in client.get(f"/v1/jobs/{video.id}").json()["outputs"]] == [0]


def test_previews_go_with_the_video_when_it_is_deleted(stack, sdk):
    done = sdk.videos.create_and_poll(model="test-video", prompt="ok")
    thumb = sdk.videos.download_content(done.id, variant="thumbnail").content
    assert thumb[:4] == b"RIFF"
    assert sdk.videos.delete(done.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        sdk.videos.download_content(done.id, variant="thumbnail")


CLIP = ("clip.mp4", b"\0" * 64, "video/mp4")


@pytest.mark.parametrize("call", ["remix", "edit", "extend", "create_character"])
def test_capabilities_no_pipeline_has_are_a_400_naming_model_and_capability(
        sdk, video, call):
    # This SDK sends edit and extend as multipart and only with a file for `video` (its
    # `{"id": ...}` form fails in the SDK itself); the JSON form is checked below.
    calls = {
        "remix": lambda: sdk.videos.remix(video.id, prompt="now at dawn"),
        "edit": lambda: sdk.videos.edit(prompt="at dawn", video=CLIP),
        "extend": lambda: sdk.videos.extend(prompt="more", seconds="4", video=CLIP),
        "create_character": lambda: sdk.videos.create_character(name="Keeper", video=CLIP),
    }
    with pytest.raises(openai.BadRequestError) as exc:
        calls[call]()
    body = exc.value.body
    assert body["code"] == "unsupported_capability", body
    assert call in body["message"] and "model '" in body["message"], body
    if call == "remix":  # the source video's model
        assert f"model '{video.model}'" in body["message"]


@pytest.mark.parametrize("route", ["edits", "extensions"])
def test_a_json_edit_or_extension_names_the_source_videos_model(client, video, route):
    resp = client.post(f"/v1/videos/{route}", json={
        "prompt": "more", "seconds": "4", "video": {"id": video.id}})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "unsupported_capability"
    assert f"model '{video.model}'" in resp.json()["error"]["message"]


def test_remixing_another_tenants_or_no_video_is_404(sdk):
    with pytest.raises(openai.NotFoundError):
        sdk.videos.remix("video_" + "0" * 32, prompt="x")


def test_list_order_and_poll_header_still_work(sdk, video):
    created = sdk.videos.with_raw_response.create(model="test-video", prompt="ok")
    assert created.headers["openai-poll-after-ms"] == "500"
    newest = created.parse()
    ids = [v.id for v in sdk.videos.list(order="desc").data]
    assert ids.index(newest.id) < ids.index(video.id)
    asc = [v.id for v in sdk.videos.list(order="asc").data]
    assert asc.index(video.id) < asc.index(newest.id)


def test_a_cancelled_video_is_failed_with_a_reason_and_the_job_keeps_its_status(sdk, client):
    made = sdk.videos.create(model="test-video-slow", prompt="ok")
    cancelled = client.post(f"/v1/jobs/{made.id}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    shown = sdk.videos.retrieve(made.id)
    assert shown.status == "failed" and shown.error.code == "cancelled", shown
    assert any(v.id == made.id and v.status == "failed" for v in sdk.videos.list().data)
    assert client.get(f"/v1/jobs/{made.id}").json()["status"] == "cancelled"


def test_sse_speech_reports_real_usage(client):
    text = "The lighthouse keeper climbs the stairs."
    resp = client.post("/v1/audio/speech", json={
        "model": "tts-1", "input": text, "response_format": "mp3", "stream_format": "sse"})
    assert resp.status_code == 200 and resp.headers["content-type"].startswith(
        "text/event-stream")
    assert conformance.check("POST", "/v1/audio/speech", 200, "text/event-stream",
                             resp.content) == []
    events = [json.loads(line[5:]) for line in resp.text.splitlines()
              if line.startswith("data:")]
    done = events[-1]
    assert done["type"] == "speech.audio.done", done
    job = client.get(f"/v1/jobs/{resp.headers['x-job-id']}").json()
    seconds = job["outputs"][0]["duration_s"]
    usage = done["usage"]
    assert usage["input_tokens"] == len(text)
    assert usage["output_tokens"] == round(seconds * 50) > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_file_expiry_policies_are_honoured_and_checked(sdk):
    made = sdk.files.create(file=("in.jsonl", io.BytesIO(b"{}\n")), purpose="batch",
                            expires_after={"anchor": "created_at", "seconds": 7200})
    assert made.expires_at - made.created_at == 7200
    assert sdk.files.retrieve(made.id).expires_at == made.expires_at
    for bad in ({"anchor": "created_at", "seconds": 60},
                {"anchor": "last_active_at", "seconds": 7200}):
        with pytest.raises(openai.BadRequestError) as exc:
            sdk.files.create(file=("in.jsonl", io.BytesIO(b"{}\n")), purpose="batch",
                             expires_after=bad)
        assert exc.value.body["param"] == "expires_after"
    content = sdk.files.with_raw_response.content(made.id)
    assert content.headers["content-type"] == "application/json"
    assert content.content == b"{}\n"


def test_a_batch_honours_output_expires_after(sdk):
    line = {"custom_id": "a", "method": "POST", "url": "/v1/audio/speech",
            "body": {"model": "tts-1", "input": "Hello there.", "response_format": "wav"}}
    source = sdk.files.create(file=("in.jsonl", io.BytesIO(json.dumps(line).encode() + b"\n")),
                              purpose="batch")
    batch = sdk.batches.create(input_file_id=source.id, endpoint="/v1/audio/speech",
                               completion_window="24h",
                               output_expires_after={"anchor": "created_at", "seconds": 3600})
    deadline = time.monotonic() + 120
    while (batch := sdk.batches.retrieve(batch.id)).status not in (
            "completed", "failed", "cancelled", "expired"):
        assert time.monotonic() < deadline, batch
        time.sleep(0.3)
    assert batch.status == "completed", batch
    output = sdk.files.retrieve(batch.output_file_id)
    assert output.expires_at - output.created_at == 3600
    [result] = [json.loads(x) for x in sdk.files.content(output.id).text.splitlines()]
    assert result["response"]["body"]["status"] == "completed", result


def test_models_and_errors_conform(sdk, client):
    models = sdk.models.list()
    assert models.data and sdk.models.retrieve(models.data[0].id).id == models.data[0].id
    resp = client.get("/v1/videos/video_" + "0" * 32)
    assert resp.status_code == 404
    assert conformance.check("GET", "/v1/videos/x", 404, resp.headers["content-type"],
                             resp.content) == []
