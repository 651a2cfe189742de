"""The embedded mode (``omnijobs dev``): SQLite, filesystem broker, local signed URLs."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest

from ..services import ROOT, free_port, wait_until
from .helpers import decode, wait_job


@pytest.fixture(scope="module")
def embedded(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("embedded")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNIJOBS_")}
    env.update(PYTHONPATH=str(ROOT), OMNIJOBS_SIGNED_URL_TTL_S="3")
    with (cwd / "dev.log").open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "omnijobs.cli", "dev", "--port",
                                 str(port)], cwd=cwd, env=env, stdout=log,
                                stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: httpx.get(f"{base}/readyz").status_code == 200, 90, "omnijobs dev")
        key = (cwd / ".omnijobs" / "dev-api-key").read_text().strip()
        yield base, key, cwd
    finally:
        proc.terminate()
        proc.wait(30)
    assert proc.returncode == 0
    wait_until(lambda: not processes_in(cwd), 30, "worker processes to exit with omnijobs dev")


def processes_in(cwd) -> list[int]:
    """Pids whose working directory is ``cwd`` (the worker and its beat, if left behind)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/cwd") == str(cwd):
                    found.append(int(entry))
            except OSError:
                continue
    return found


def test_embedded_speech_and_local_signed_urls(embedded):
    base, key, cwd = embedded
    printed = (cwd / "dev.log").read_text()
    assert key in printed and "curl" in printed
    wait_until(lambda: "maintenance running: relay every" in (cwd / "dev.log").read_text(),
               60, "the maintenance process")  # the upkeep runs in this mode too
    assert (cwd / ".omnijobs" / "omnijobs.db").exists()
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"},
                      timeout=60) as c:
        resp = c.post("/v1/audio/speech", json={"model": "tts-1", "voice": "alloy",
                                                "response_format": "wav",
                                                "input": "Hello from omnijobs."})
        assert resp.status_code == 200, resp.text
        probe = decode(resp.content, "wav")
        assert probe.sample_rate == 22050 and probe.duration_s > 0.5
        job = wait_job(c, resp.headers["x-job-id"])
    url = job["outputs"][0]["url"]
    assert url.startswith(base + "/v1/objects/")
    assert httpx.get(url).content == resp.content  # no Authorization header
    assert httpx.get(url.replace("signature=", "signature=0")).status_code == 403
    time.sleep(4)
    expired = httpx.get(url)
    assert expired.status_code == 403
    assert expired.json()["error"]["code"] == "signature_expired"


def test_dev_output_is_for_a_person(embedded):
    """Readable lines, no Celery banners and no per-connection warnings scrolling the
    API key away; the banner says where the key is kept."""
    _base, key, cwd = embedded
    log = cwd / "dev.log"
    wait_until(lambda: log.read_text().count(" ready.") >= 2, 60, "the worker and maintenance")
    printed = log.read_text()
    assert "(saved in .omnijobs/dev-api-key: KEY=$(cat .omnijobs/dev-api-key))" in printed
    assert (cwd / ".omnijobs" / "dev-api-key").read_text().strip() == key
    assert not [line for line in printed.splitlines() if line.startswith("{")]
    assert "-------------- " not in printed and "[queues]" not in printed
    assert "No hostname was supplied" not in printed
    assert "INFO    tasks.maintenance: maintenance running" in printed


def test_embedded_live_results_through_the_spool(embedded):
    """The worker is another process with no Redis: events and streamed audio reach the
    API through the spool folder under OMNIJOBS_HOME."""
    import json

    base, key, cwd = embedded
    text = " ".join(f"This is sentence number {n} of the stream." for n in range(1, 6))
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"},
                      timeout=60) as c:
        with c.stream("POST", "/v1/audio/speech", json={
                "model": "tts-1", "input": text, "response_format": "pcm",
                "stream_format": "audio"}) as resp:
            assert resp.status_code == 200, resp.read()
            job_id = resp.headers["x-job-id"]
            pieces = [p for p in resp.iter_raw() if p]
        job = wait_job(c, job_id)
        streamed = decode(b"".join(pieces), "pcm")
        assert abs(streamed.duration_s - job["outputs"][0]["duration_s"]) < 0.01
        spool = cwd / ".omnijobs" / "live" / job_id  # sentence by sentence, from the worker
        assert (spool / "listening").exists() and len(list(spool.glob("a-*.npy"))) > 1
        with c.stream("GET", f"/v1/jobs/{job_id}/events") as resp:
            data = [line for line in resp.iter_lines() if line.startswith("data: ")]
        assert [json.loads(d[6:])["status"] for d in data] == ["completed", "completed"]
        running = c.post("/v1/audio/speech", headers={"Prefer": "respond-async"},
                         json={"model": "tts-1", "input": text}).json()["id"]
        with c.stream("GET", f"/v1/jobs/{running}/events") as resp:
            kinds = [line[7:] for line in resp.iter_lines() if line.startswith("event: ")]
        assert kinds[-2:] == ["status", "output"] and kinds[0] == "status"
        assert len(kinds) >= 3  # it saw the job before it ended
