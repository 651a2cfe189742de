"""Helpers for the end-to-end tests: polling, decoding downloads, and the fake engine's
files as a test sees them."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from media.encode import FORMATS
from media.probe import AudioProbe, probe_audio

from ..services import wait_until

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


class EngineFiles:
    """A worker's fake Audex engine (tests/fake_omni.py), seen from the test: its hold
    file (while it exists the engine admits requests but runs no step), its stats file,
    and its die marker (a "[die]" prompt kills the engine once)."""

    def __init__(self, folder: Path) -> None:
        self.hold, self.stats_file = folder / "hold", folder / "stats.json"
        self.died = folder / "died"
        self.metrics_url = ""  # the worker's metrics, where the test started it with a port

    def pipeline_options(self, options_json: str) -> str:
        """``OMNIJOBS_PIPELINE_OPTIONS`` with audex-tts's engine writing these files."""
        options = json.loads(options_json)
        options["audex-tts"]["engine_kwargs"] = {"hold_file": str(self.hold),
                                                 "stats_file": str(self.stats_file),
                                                 "die_marker": str(self.died)}
        return json.dumps(options)

    def stats(self) -> dict:
        try:
            return json.loads(self.stats_file.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {"peak_seqs": 0, "running_seqs": 0, "running": [], "waiting": []}

    def running(self, job_ids: list[str]) -> list[str]:
        """The jobs of ``job_ids`` whose engine request is running now."""
        running = self.stats()["running"]
        return [j for j in job_ids if any(r.startswith(f"{j}-") for r in running)]

    def wait_running(self, job_ids: list[str]) -> None:
        wait_until(lambda: self.running(job_ids) == job_ids, 60,
                   f"{len(job_ids)} jobs in the engine")


def render_seconds_counter(url: str, pipeline: str) -> float:
    """A worker's ``omnijobs_render_seconds_total`` for ``pipeline`` (every tenant)."""
    text = httpx.get(url, timeout=10).text
    return sum(s.value for family in text_string_to_metric_families(text)
               for s in family.samples if s.name == "omnijobs_render_seconds_total"
               and s.labels.get("pipeline") == pipeline)
