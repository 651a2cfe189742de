"""The GPU worker process model, with the fake vLLM-Omni engine at the GPU boundary."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from openai import OpenAI

from media.probe import probe_audio, probe_video

from ..services import spawn, wait_until
from .helpers import assert_openai_error, wait_job

AUDEX = "nvidia/Nemotron-Labs-Audex-2B"


@pytest.fixture(scope="module")
def gpu_worker(stack):
    # six GPUs: minimax_h3_disaggregated.yaml's stages name six (Audex's uses the first)
    proc = spawn("gpu-worker", ["worker", "--pipeline", "audex-tts", "--pipeline", "minimax-h3",
                                "--gpu", "0,1,2,3,4,5"], stack.env,
                 stack.processes["worker"].log.parent)
    stack.processes["gpu-worker"] = proc
    wait_until(lambda: "ready" in proc.log.read_text(), 120, "gpu worker")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def key(stack) -> str:
    return stack.new_key("gpu-tenant")


def test_audex_speech_with_guidance_through_the_sdk(stack, gpu_worker, key):
    sdk = OpenAI(base_url=f"{stack.base_url}/v1", api_key=key, max_retries=0)
    resp = sdk.audio.speech.create(model=AUDEX, voice="default", response_format="wav",
                                   input="Guided speech from a fake engine.",
                                   extra_body={"cfg_scale": 1.5})
    probe = probe_audio(resp.read())
    assert probe.sample_rate == 16000 and probe.channels == 1
    assert probe.duration_s == pytest.approx(0.25 * 6, abs=0.01)


def test_audex_rejections_at_submit(stack, key):
    with stack.client(key) as c:
        for body, param in [({"voice": "alloy"}, "voice"), ({"ref_audio": "x"}, "ref_audio"),
                            ({"cfg_pair_id": "mine"}, "cfg_pair_id"),
                            ({"cfg_scale": 20}, "cfg_scale")]:
            resp = c.post("/v1/audio/speech", json={"model": AUDEX, "input": "hi", **body})
            assert assert_openai_error(resp, 400)["param"] == param


def test_dead_engine_restarts_the_worker_and_the_job_completes(stack, gpu_worker, key):
    with stack.client(key) as c:
        resp = c.post("/v1/audio/speech", headers={"Prefer": "respond-async"},
                      json={"model": AUDEX, "input": "[die] then live again"})
        job = wait_job(c, resp.json()["id"], timeout=120)
    assert job["status"] == "completed", job
    assert job["attempts"] == 2
    log = gpu_worker.log.read_text()
    assert "engine_dead" in log and "starting a fresh one" in log
    assert gpu_worker.proc.poll() is None  # the supervisor lives on
    # the dead engine's process shut its engine down (its stages, their GPU memory)
    # before it exited for the restart
    shut = (Path(stack.env["OMNIJOBS_HOME"]) / "engine-shutdown").read_text().split()
    assert shut[1::2] == ["shutdown"] and len(shut) == 2


def test_an_engine_that_will_not_stop_holds_the_exit_only_within_its_bound(stack, tmp_path):
    options = json.loads(stack.env["OMNIJOBS_PIPELINE_OPTIONS"])
    options["audex-tts"].update(shutdown_timeout_s=1)
    options["audex-tts"]["engine_kwargs"] = {"shutdown_s": 600}  # a stage that hangs
    env = {**stack.env, "OMNIJOBS_PIPELINE_OPTIONS": json.dumps(options)}
    proc = spawn("stuck-shutdown", ["worker", "--pipeline", "audex-tts"], env, tmp_path)
    try:
        wait_until(lambda: "ready" in proc.log.read_text(), 120, "worker")
        proc.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: proc.proc.poll() is not None, 60, "the worker's exit")
    finally:
        proc.stop()
    assert "shutdown did not finish within 1 s; exiting anyway" in proc.log.read_text()
    assert proc.proc.returncode == 0


def test_t2va_video_through_the_sdk(stack, gpu_worker, key):
    sdk = OpenAI(base_url=f"{stack.base_url}/v1", api_key=key, max_retries=0)
    video = sdk.videos.create_and_poll(model="MiniMaxAI/MiniMax-H3", prompt="A kite at noon",
                                       seconds="4", size="448x256")
    assert video.status == "completed", video
    probe = probe_video(sdk.videos.download_content(video.id).read())
    # 96 frames asked; H3 renders on its 17n+5 grid and the job says so
    assert probe.frames == 107 and probe.audio.sample_rate == 32000 and probe.audio.channels == 2
    assert video.model_extra["outputs"][0]["frames"] == 107
    seed = video.model_extra["seed"]  # drawn at submit, so a rerun can reproduce it
    assert isinstance(seed, int) and 0 <= seed < 2**31


def test_t2va_contract_rejections_and_idempotent_seeds(stack, key):
    with stack.client(key) as c:
        for body, param in [({"seconds": 2}, "seconds"), ({"seconds": 20}, "seconds"),
                            ({"fps": 30}, "fps"), ({"size": "1000x200"}, "size"),
                            ({"size": "1920x1080"}, "size"),
                            ({"negative_prompt": "blur"}, "negative_prompt"),
                            ({"guidance_scale": 4}, "guidance_scale")]:
            resp = c.post("/v1/videos", json={"model": "minimax-h3", "prompt": "x", **body})
            error = assert_openai_error(resp, 400)
            assert error["param"] == param
            if param not in ("seconds", "fps"):  # what the model cannot do names it
                assert "'minimax-h3'" in error["message"], error
        body = {"model": "minimax-h3", "prompt": "Idempotent kite", "seconds": 4,
                "size": "448x256"}
        first = c.post("/v1/videos", json=body, headers={"Idempotency-Key": "kite-1"})
        again = c.post("/v1/videos", json=body, headers={"Idempotency-Key": "kite-1"})
        other = c.post("/v1/videos", json=body)
        assert first.status_code == again.status_code == other.status_code == 200
        assert first.json()["id"] == again.json()["id"] != other.json()["id"]
        assert first.json()["seed"] == again.json()["seed"] != other.json()["seed"]
        for video in (first.json(), other.json()):  # nothing left running for later tests
            c.delete(f"/v1/videos/{video['id']}")


def test_a_killed_worker_is_logged_and_started_again(stack, gpu_worker, key):
    """kill -9 (or the OOM killer) on the worker under its supervisor: the supervisor
    says which signal, starts a fresh worker after a backoff, and lives on."""
    supervisor = gpu_worker.proc.pid
    children = Path(f"/proc/{supervisor}/task/{supervisor}/children")
    [child] = children.read_text().split()
    readies = gpu_worker.log.read_text().count(" ready.")
    os.kill(int(child), signal.SIGKILL)
    wait_until(lambda: gpu_worker.log.read_text().count(" ready.") > readies, 120,
               "a fresh worker")
    log = gpu_worker.log.read_text()
    assert f"worker (pid {child}) was killed by SIGKILL; starting a fresh one in 1 s" in log
    assert gpu_worker.proc.poll() is None and children.read_text().split() != [child]
    with stack.client(key) as c:  # and it serves
        resp = c.post("/v1/audio/speech", headers={"Prefer": "respond-async"},
                      json={"model": AUDEX, "input": "After the kill."})
        assert wait_job(c, resp.json()["id"], timeout=120)["status"] == "completed"
