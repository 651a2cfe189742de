"""Synchronous speech: a waiting ``POST /v1/audio/speech`` against the same work in-process.

One worker serves piper-joe. Each round sends one synchronous request (short sentence,
wav, keep-alive connection) and then, in this process, runs the project's own Piper
pipeline and ``media.encode`` on the same text, so both sides see the same machine noise.
The overhead is the difference of the two medians: queueing, claim, validation, upload,
the database writes and the wait for completion.
"""

from __future__ import annotations

import statistics
import time
from functools import cache

import httpx

from .report import Figure

TEXT = "The quick brown fox jumps over the lazy dog."
BODY = {"model": "tts-1", "input": TEXT, "voice": "alloy", "response_format": "wav"}
TARGET_MS = 20.0


@cache
def _piper():
    from pipelines.piper_tts import PiperJoe

    pipeline = PiperJoe()
    pipeline.load()
    return pipeline


def synthesize_and_encode() -> bytes:
    """In-process: Piper synthesis, aggregation and WAV encoding of TEXT."""
    from media.audio import AudioAggregator
    from media.encode import encode_audio
    from pipelines import RunContext, SpeechRequest

    pipeline = _piper()
    aggregator = AudioAggregator(pipeline.spec.audio_mode)
    request = SpeechRequest(input=TEXT, voice="alloy", response_format="wav")
    for piece in pipeline.speech(request, RunContext(job_id="bench")):
        aggregator.add(piece.samples, piece.sample_rate)
    return encode_audio(aggregator.result(), "wav").data


def _timed(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def _request(client: httpx.Client) -> None:
    response = client.post("/v1/audio/speech", json=BODY)
    if response.status_code != 200 or not response.content.startswith(b"RIFF"):
        raise RuntimeError(f"synchronous speech answered {response.status_code}: "
                           f"{response.text[:300]}")


def measure(base_url: str, key: str, rounds: int) -> dict:
    """Interleaved rounds of (HTTP request, in-process run); medians in ms."""
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=base_url, headers=headers, timeout=120) as client:
        _request(client)  # warm: first synthesis, connections, pools
        synthesize_and_encode()
        http, local = [], []
        for _ in range(rounds):
            http.append(_timed(lambda: _request(client)))
            local.append(_timed(synthesize_and_encode))
    p50, ref = statistics.median(http) * 1000, statistics.median(local) * 1000
    return {"rounds": rounds, "http_p50_ms": round(p50, 1), "in_process_p50_ms": round(ref, 1),
            "overhead_ms": round(p50 - ref, 1),
            "http_ms": [round(t * 1000, 1) for t in http],
            "in_process_ms": [round(t * 1000, 1) for t in local]}


def figure(data: dict) -> Figure:
    p50, ref, overhead = data["http_p50_ms"], data["in_process_p50_ms"], data["overhead_ms"]
    return Figure(key="sync_speech",
                  name="synchronous speech p50 (short sentence, wav, one worker)",
                  target=f"overhead ≤ {TARGET_MS:.0f} ms p50 over in-process Piper + WAV",
                  measured=f"{p50:.0f} ms (in-process Piper + WAV: {ref:.0f} ms; "
                           f"overhead {overhead:.0f} ms)",
                  ratio=f"{p50 / ref:.2f}x", met=overhead <= TARGET_MS, data=data)
