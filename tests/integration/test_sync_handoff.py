"""A synchronous speech request is handed its result with the completion: the worker
sends the bytes it stored to the API process that waits, after the job is recorded, and
the answer needs no store GET. What is stored and recorded is exactly as without it.

Over the real stack (API, worker, PostgreSQL, Redis, SeaweedFS, Piper), and the Redis
bus on its own for what travels where."""

from __future__ import annotations

import asyncio
import hashlib

import httpx
import pytest

from core.settings import Settings
from storage.bus import HANDOFF_MAX_BYTES, RedisBus, Result

from ..services import free_port, redis_db, spawn, wait_until
from .helpers import decode

TEXT = "A waited answer comes with the completion. The store keeps its copy."


@pytest.fixture(scope="module")
def key(stack) -> str:
    return stack.new_key("handoff")


@pytest.fixture(scope="module")
def blind_api(stack):
    """An API process of the same deployment that cannot read the object store (a wrong
    secret): every answer it gives from stored bytes would fail."""
    port = free_port()
    env = dict(stack.env, OMNIJOBS_S3_SECRET_ACCESS_KEY="not-the-secret")
    home = stack.processes["api"].log.parent
    proc = spawn("api-blind", ["api", "--port", str(port)], env, home)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: httpx.get(f"{base}/healthz", timeout=2).status_code == 200, 60,
                   "the API that cannot read the store")
        yield base
    finally:
        proc.stop()


def test_a_waited_result_is_answered_without_reading_the_store(stack, key, blind_api):
    with httpx.Client(base_url=blind_api, timeout=60,
                      headers={"Authorization": f"Bearer {key}"}) as blind:
        # the store is out of this process's reach: its own content route says so
        resp = blind.post("/v1/audio/speech", json={"model": "tts-1", "input": TEXT,
                                                    "response_format": "wav"})
    assert resp.status_code == 200, resp.text
    job_id = resp.headers["x-job-id"]
    assert resp.headers["content-type"] == "audio/wav"
    answer = resp.content
    with stack.client(key) as client:
        job = client.get(f"/v1/jobs/{job_id}").json()
        stored = client.get(f"/v1/jobs/{job_id}/content")
    # the record and the stored object are the ones any other answer would give
    assert job["status"] == "completed" and job["attempts"] == 1 and job["progress"] == 100
    [out] = job["outputs"]
    assert stored.status_code == 200 and stored.content == answer
    assert out["bytes"] == len(answer)
    assert out["sha256"] == hashlib.sha256(answer).hexdigest()
    probe = decode(answer, "wav")
    assert probe.sample_rate == out["sample_rate"] == 22050
    assert abs(probe.duration_s - out["duration_s"]) < 0.01


def test_the_blind_process_still_fails_a_read_it_must_make(stack, key, blind_api):
    """The control: without a handed result, that process cannot answer from the store
    (so the answer above came with the completion)."""
    with stack.client(key) as client:
        resp = client.post("/v1/audio/speech", headers={"Prefer": "respond-async"},
                           json={"model": "tts-1", "input": TEXT})
        job_id = resp.json()["id"]
        wait_until(lambda: client.get(f"/v1/jobs/{job_id}").json()["status"] == "completed",
                   60, "the job")
    with httpx.Client(base_url=blind_api, timeout=60,
                      headers={"Authorization": f"Bearer {key}"}) as blind:
        assert blind.get(f"/v1/jobs/{job_id}/content").status_code >= 500


def test_the_bus_hands_a_result_only_to_the_process_that_expects_it():
    with redis_db() as url:
        settings = Settings(broker_url=url)
        api, other, worker = RedisBus(settings), RedisBus(settings), RedisBus(settings)
        data = bytes(range(256)) * 16 + b"\n\x00tail"
        result = Result("job_handoff", 1, "audio/wav", data)

        async def run() -> tuple[Result | None, Result | None, bool, bool]:
            mine, theirs = api.watcher(), other.watcher()
            with mine.subscribe("job_handoff") as sub, theirs.subscribe("job_handoff") as sub2:
                await asyncio.sleep(0.3)  # both subscriptions are up
                nobody = worker.hand_result(result)  # no wait asked for it yet
                api.expect_result("job_handoff", 5)
                too_big = worker.hand_result(
                    Result("job_handoff", 1, "audio/wav", b"x" * (HANDOFF_MAX_BYTES + 1)))
                assert worker.hand_result(result)
                deadline = asyncio.get_running_loop().time() + 10
                while sub.result is None:  # (wake-ups from subscribing come first)
                    assert await sub.wait(deadline - asyncio.get_running_loop().time())
                await asyncio.sleep(0.2)  # anything meant for the other would be here
                return sub.result, sub2.result, nobody, too_big

        got, elsewhere, nobody, too_big = asyncio.run(run())
    assert not nobody and not too_big
    assert got == result and got.data == data
    assert elsewhere is None  # another API process never receives the bytes
