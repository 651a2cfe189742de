"""Helpers for the end-to-end tests: polling and decoding downloads."""

from __future__ import annotations

import time

import httpx

from media.encode import FORMATS
from media.probe import AudioProbe, probe_audio

TERMINAL = {"completed", "failed", "cancelled"}


def wait_job(client: httpx.Client, job_id: str, timeout: float = 60,
             until=lambda job: job["status"] in TERMINAL) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if until(job):
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} not done in {timeout}s: {job}")


def decode(data: bytes, fmt: str, sample_rate: int | None = None) -> AudioProbe:
    """Decode with the format's own demuxer (raw pcm is 24 kHz mono by contract)."""
    return probe_audio(data, container_format=FORMATS[fmt].demuxer,
                       raw_rate=sample_rate or 24000)


def assert_openai_error(resp: httpx.Response, status: int, code: str | None = None) -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"]
    if code is not None:
        assert err["code"] == code, err
    return err
