"""Video jobs end to end: OpenAI Videos API, real worker, real mux, SeaweedFS."""

from __future__ import annotations

import hashlib
import time

import httpx
import pytest
from openai import OpenAI

from media.probe import probe_video

from .helpers import assert_openai_error

LONG = "y" * 200
PROMPT = "A lighthouse at dusk, waves rolling in."


@pytest.fixture(scope="module")
def key(stack) -> str:
    return stack.new_key("studio")


@pytest.fixture(scope="module")
def client(stack, key):
    with stack.client(key) as c:
        yield c


def wait_video(client, video_id, timeout=90, seen=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        video = client.get(f"/v1/videos/{video_id}").json()
        if seen is not None:
            seen.append((video["status"], video["progress"]))
        if video["status"] in ("completed", "failed", "cancelled"):
            return video
        time.sleep(0.1)
    raise AssertionError(f"video {video_id} unfinished: {video}")


def assert_synced_mp4(data: bytes, fps: int, sample_rate: int) -> None:
    probe = probe_video(data)
    assert probe.video_codec == "h264" and probe.audio is not None
    assert probe.audio.codec == "aac" and probe.audio.sample_rate == sample_rate
    assert round(probe.fps) == fps
    assert abs(probe.duration_s - probe.audio.duration_s) <= 1 / fps + 2048 / sample_rate + 0.05


def test_openai_sdk_create_poll_download(stack, key):
    sdk = OpenAI(base_url=f"{stack.base_url}/v1", api_key=key, max_retries=0)
    video = sdk.videos.create_and_poll(model="reference-t2va", prompt=PROMPT, seconds="4",
                                       size="448x256")
    assert video.status == "completed" and video.progress == 100, video
    assert video.seconds == "4" and video.size == "1280x720"  # OpenAI's size of its shape
    assert video.model_dump()["resolution"] == "448x256"  # the pixels asked for
    data = sdk.videos.download_content(video.id, variant="video").read()
    assert_synced_mp4(data, 24, 22050)
    probe = probe_video(data)
    assert probe.frames == 96 and (probe.width, probe.height) == (448, 256)
    raw = video.model_dump()
    assert raw["fps"] == 24 and raw["audio_sample_rate"] == 22050
    [out] = raw["outputs"]
    downloaded = httpx.get(out["url"]).content  # signed, no API key
    assert hashlib.sha256(downloaded).hexdigest() == out["sha256"] == hashlib.sha256(
        data).hexdigest()
    assert any(v.id == video.id for v in sdk.videos.list().data)


def test_a_signed_s3_url_plays_and_seeks_as_a_video_element_asks(stack, client):
    """Production mode against SeaweedFS: a <video> sends GET with ``Range: bytes=0-``,
    then the ranges it seeks to; ``bytes=0-0`` tells a client the size. HEAD is refused:
    a presigned URL is signed for one method (docs/deploy.md says so)."""
    resp = client.post("/v1/videos", json={"model": "reference-t2va", "prompt": PROMPT,
                                           "seconds": 1, "size": "320x240", "fps": 12})
    video = wait_video(client, resp.json()["id"])
    assert video["status"] == "completed", video
    data = client.get(f"/v1/videos/{video['id']}/content").content
    url = client.get(f"/v1/jobs/{video['id']}").json()["outputs"][0]["url"]  # freshly signed
    assert stack.env["OMNIJOBS_MODE"] == "production" and "/v1/objects/" not in url
    size = len(data)
    first = httpx.get(url, headers={"Range": "bytes=0-"})
    assert first.status_code == 206 and first.content == data
    assert first.headers["content-range"] == f"bytes 0-{size - 1}/{size}"
    seek = httpx.get(url, headers={"Range": f"bytes={size // 2}-{size // 2 + 999}"})
    assert seek.status_code == 206 and seek.content == data[size // 2:size // 2 + 1000]
    assert seek.headers["content-range"] == f"bytes {size // 2}-{size // 2 + 999}/{size}"
    probe = httpx.get(url, headers={"Range": "bytes=0-0"})
    assert probe.status_code == 206 and probe.headers["content-range"] == f"bytes 0-0/{size}"
    assert httpx.head(url).status_code == 403


def test_json_create_n2_each_with_own_output(client):
    resp = client.post("/v1/videos", json={
        "model": "sora-2", "prompt": PROMPT, "seconds": 2, "size": "320x240", "fps": 12,
        "n": 2, "seed": 7, "metadata": {"shot": "12A"}})
    assert resp.status_code == 200, resp.text
    assert resp.json()["status"] == "queued" and resp.json()["object"] == "video"
    video = wait_video(client, resp.json()["id"])
    assert video["status"] == "completed", video
    assert video["metadata"] == {"shot": "12A"} and video["fps"] == 12
    assert [o["index"] for o in video["outputs"]] == [0, 1]
    bodies = []
    for out in video["outputs"]:
        assert out["fps"] == 12 and out["frames"] == 24 and out["sample_rate"] == 22050
        data = client.get(f"/v1/videos/{video['id']}/content",
                          params={"index": out["index"]}).content
        assert_synced_mp4(data, 12, 22050)
        bodies.append(data)
    assert bodies[0] != bodies[1]


def test_progress_advances_while_rendering(client):
    video = client.post("/v1/videos", json={"model": "test-video-slow", "prompt": "ok"}).json()
    seen: list[tuple[str, int]] = []
    final = wait_video(client, video["id"], seen=seen)
    assert final["status"] == "completed" and final["progress"] == 100
    progress = [p for _, p in seen]
    assert progress == sorted(progress)
    assert any(0 < p < 100 for p in progress), seen
    assert ("in_progress" in {s for s, _ in seen})


def test_invalid_output_fails_with_reason(client):
    video = client.post("/v1/videos", json={"model": "test-video",
                                            "prompt": "av-mismatch"}).json()
    final = wait_video(client, video["id"])
    assert final["status"] == "failed"
    assert final["error"]["code"] == "av_duration_mismatch"
    assert "audio lasts" in final["error"]["message"]


BAD = [
    ({"prompt": PROMPT, "output_format": "mov" + LONG}, "output_format"),
    ({"prompt": PROMPT, "size": "449x256"}, "size"),
    ({"prompt": PROMPT, "size": "big"}, "size"),
    ({"prompt": PROMPT, "size": "4000x4000"}, "size"),
    ({"prompt": PROMPT, "n": 5}, "n"),
    ({"prompt": PROMPT, "seconds": 0}, "seconds"),
    ({"prompt": PROMPT, "seconds": 60}, "seconds"),
    ({"prompt": PROMPT, "fps": 23.5}, "fps"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": PROMPT, "model": "tts-1"}, "model"),
    ({"prompt": PROMPT, "model": "nope" + LONG}, "model"),
    ({"prompt": PROMPT, "style": "noir"}, "style"),
]


@pytest.mark.parametrize(("body", "param"), BAD, ids=[p for _, p in BAD])
def test_bad_video_request_is_400_and_queues_nothing(stack, body, param):
    with stack.client(stack.new_key("video-careless")) as c:
        err = assert_openai_error(c.post("/v1/videos", json=body), 400)
        assert err["param"] == param
        assert LONG not in err["message"]
        assert c.get("/v1/videos").json()["data"] == []


def test_multipart_create_and_file_upload_refused(client):
    form = client.post("/v1/videos", data={"prompt": PROMPT, "seconds": "1",
                                           "size": "160x96", "model": "reference-t2va"})
    assert form.status_code == 200, form.text
    assert wait_video(client, form.json()["id"])["status"] == "completed"
    upload = client.post("/v1/videos", data={"prompt": PROMPT},
                         files={"input_reference": ("ref.png", b"\x89PNG....", "image/png")})
    assert_openai_error(upload, 400, "unsupported_parameter")


def test_delete_finished_and_running(client):
    done = client.post("/v1/videos", json={"model": "test-video", "prompt": "ok"}).json()
    done = wait_video(client, done["id"])
    url = done["outputs"][0]["url"]
    assert httpx.get(url).status_code == 200
    deleted = client.delete(f"/v1/videos/{done['id']}").json()
    assert deleted == {"id": done["id"], "object": "video.deleted", "deleted": True}
    assert_openai_error(client.get(f"/v1/videos/{done['id']}"), 404)
    assert httpx.get(url).status_code == 404  # the object is gone, not just the record

    running = client.post("/v1/videos", json={"model": "test-video-slow", "prompt": "ok"})
    video_id = running.json()["id"]
    deadline = time.monotonic() + 30
    while client.get(f"/v1/videos/{video_id}").json()["status"] == "queued":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert client.delete(f"/v1/videos/{video_id}").json()["deleted"] is True
    assert_openai_error(client.get(f"/v1/videos/{video_id}"), 404)


def test_content_variants(client):
    video = client.post("/v1/videos", json={"model": "test-video", "prompt": "ok"}).json()
    assert_openai_error(client.get(f"/v1/videos/{video['id']}/content",
                                   params={"variant": "thumbnail"}), 409, "job_not_completed")
    wait_video(client, video["id"])
    assert_openai_error(client.get(f"/v1/videos/{video['id']}/content",
                                   params={"variant": "poster"}), 400, "unsupported_variant")
    assert_openai_error(client.get(f"/v1/videos/{video['id']}/content",
                                   params={"index": 3}), 404)
