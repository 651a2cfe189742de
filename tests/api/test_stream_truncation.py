"""Streamed speech never ends normally short of the stored output: the worker's bus writes
fail after the first second of a 5 s job, the job completes with all 5 s stored, and the
stream must either deliver the 5 s or end with an error (in process: the embedded spool
bus, the local store; this test plays the worker with the real tap and finalize)."""

from __future__ import annotations

import json
import threading
import time
import uuid

import numpy as np
import pytest

from media.audio import AudioAggregator
from media.stream import STREAMABLE, stream_encoder
from pipelines import get_spec
from storage.db import make_engine, make_sessionmaker
from storage.repositories import KeyRepository
from tasks.finalize import finalize_speech
from tasks.live import AudioTap

from ..integration.helpers import decode

SECONDS = 5


class FailingBus:
    """The API's own bus, whose audio writes fail after the first ``ok`` ones."""

    def __init__(self, bus, ok: int) -> None:
        self._bus, self._ok = bus, ok

    def add_audio(self, *args, **kwargs):
        if self._ok <= 0:
            raise ConnectionError("bus write failed")
        self._ok -= 1
        return self._bus.add_audio(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._bus, name)


def play_worker(api, tenant: str, ok_writes: int, errors: list) -> None:
    """Claim the tenant's job once a stream listens, send 1 s pieces through the tap,
    then store all of it and complete the job, as a render worker would."""
    try:
        svc, spec = api.services, get_spec("piper-joe")
        deadline = time.monotonic() + 30
        while True:
            jobs = svc.jobs.list(tenant, limit=1)[0]
            if jobs and svc.live.bus.listening(jobs[0].id):
                break
            assert time.monotonic() < deadline, "no stream listened"
            time.sleep(0.02)
        job = svc.jobs.claim(jobs[0].id, "test-worker", 60)
        aggregator = AudioAggregator(spec.audio_mode)
        tap = AudioTap(FailingBus(svc.live.bus, ok_writes), job.id, job.attempts)
        rate = spec.sample_rate
        for second in range(SECONDS):
            t = np.arange(rate) / rate + second
            piece = (0.3 * np.sin(2 * np.pi * 330 * t)).astype(np.float32)[None, :]
            tap.add(aggregator.add(piece, rate), aggregator)
        out = finalize_speech(svc.store, job, spec, aggregator.result(), "wav")
        assert svc.jobs.complete(job.id, job.attempts, [out], 3600)
        svc.live.bus.notify(job.id)
    except Exception as exc:  # reported by the test
        errors.append(exc)


@pytest.fixture
def streaming(make_api):
    api = make_api(event_resync_s=0.2, event_stream_max_s=30)
    api.services.stream_encoder, api.services.streamable = stream_encoder, STREAMABLE
    return api


def sse_stream(api, tenant_key: str) -> list[dict]:
    with api.client(key=tenant_key) as client, client.stream(
            "POST", "/v1/audio/speech", json={"model": "tts-1", "input": "Five seconds.",
                                              "response_format": "wav",
                                              "stream_format": "sse"}) as resp:
        assert resp.status_code == 200, resp.read()
        return [json.loads(line.removeprefix("data: ")) for line in resp.iter_lines()
                if line.startswith("data: ")]


@pytest.mark.parametrize("ok_writes", [1, 2])
def test_a_stream_short_of_the_stored_output_never_ends_normally(streaming, ok_writes):
    tenant, key = KeyRepository(make_sessionmaker(make_engine(streaming.db_url))).create_key(
        "trunc-" + uuid.uuid4().hex[:8])
    errors: list = []
    worker = threading.Thread(target=play_worker, args=(streaming, tenant, ok_writes, errors))
    worker.start()
    events = sse_stream(streaming, key)
    worker.join(60)
    assert not errors, errors
    last = events[-1]
    if last["type"] == "error":
        assert "GET /v1/jobs/" in last["error"]["message"], last
        return
    assert last["type"] == "speech.audio.done", last
    audio = b"".join(__import__("base64").b64decode(e["audio"]) for e in events
                     if e["type"] == "speech.audio.delta")
    assert abs(decode(audio, "wav").duration_s - SECONDS) < 0.05
