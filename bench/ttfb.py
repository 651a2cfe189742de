"""Time to first audio byte of streamed speech, beside the pipeline's own first chunk and
the non-streaming wall time, measured side by side in one run.

A real deployment (API process, one Piper worker, PostgreSQL, Redis, SeaweedFS) takes a
ten-sentence text on the CPU voice (``piper-joe``) in interleaved rounds of:
- a streamed request (``stream_format: "audio"``, ``pcm``): time to the first body byte,
  and to the end of the stream;
- the same request without streaming (it waits for the job): its wall time;
- in this process, the project's own Piper pipeline on the same text: the time to its
  first chunk (what no service can beat) and to its last.
The figure is the streamed time to first byte p50 minus the in-process first-chunk time
p50 (target: at most 50 ms): submit, dispatch, claim, the bus and the encoder. Piper
samples its durations, so each run's audio differs a little in length.

Run: .venv/bin/python -m bench.ttfb [--rounds 15]
Needs PostgreSQL and Redis as for the tests; starts SeaweedFS itself.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from functools import cache

import httpx

from .stack import local_stack

TEXT = " ".join([
    "The first sentence opens the story.", "A second one follows close behind.",
    "Then comes the third, a little longer than the others.", "Four is short.",
    "The fifth sentence talks about the weather, which is mild.",
    "Six sentences in, the listener is still here.", "Seven brings a change of pace.",
    "The eighth sentence asks a question, doesn't it?", "Nine is nearly the end.",
    "And the tenth sentence closes the story."])
BODY = {"model": "tts-1", "input": TEXT, "voice": "alloy", "response_format": "pcm"}
TARGET_MS = 50.0


@cache
def _piper():
    from pipelines.piper_tts import PiperJoe

    pipeline = PiperJoe()
    pipeline.load()
    return pipeline


def in_process() -> tuple[float, float]:
    """(first chunk, last chunk) of the Piper pipeline on TEXT, in seconds."""
    from pipelines import RunContext, SpeechRequest

    started = time.perf_counter()
    first = None
    request = SpeechRequest(input=TEXT, voice="alloy", response_format="pcm")
    for _piece in _piper().speech(request, RunContext(job_id="bench")):
        first = first if first is not None else time.perf_counter() - started
    return first, time.perf_counter() - started


def streamed(client: httpx.Client) -> tuple[float, float, int]:
    """(first byte, end, bytes) of a streamed request."""
    started = time.perf_counter()
    first, size = None, 0
    with client.stream("POST", "/v1/audio/speech", json=BODY | {"stream_format": "audio"}
                       ) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"streamed speech answered {resp.status_code}: {resp.read()}")
        for chunk in resp.iter_raw():
            if chunk and first is None:
                first = time.perf_counter() - started
            size += len(chunk)
    return first, time.perf_counter() - started, size


def waited(client: httpx.Client) -> tuple[float, int]:
    started = time.perf_counter()
    resp = client.post("/v1/audio/speech", json=BODY)
    if resp.status_code != 200:
        raise RuntimeError(f"synchronous speech answered {resp.status_code}: {resp.text}")
    return time.perf_counter() - started, len(resp.content)


def measure(base_url: str, key: str, rounds: int) -> dict:
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {key}"},
                      timeout=120) as client:
        streamed(client), waited(client), in_process()  # warm
        rows = []
        for _ in range(rounds):
            ttfb, stream_end, stream_bytes = streamed(client)
            wall, sync_bytes = waited(client)
            first, last = in_process()
            rows.append({"ttfb": ttfb, "stream_end": stream_end, "sync_wall": wall,
                         "pipeline_first": first, "pipeline_last": last,
                         "bytes": (stream_bytes, sync_bytes)})

    def p50(name: str) -> float:
        return round(statistics.median(r[name] for r in rows) * 1000, 1)
    over = round(p50("ttfb") - p50("pipeline_first"), 1)
    paired = statistics.median((r["ttfb"] - r["pipeline_first"]) for r in rows) * 1000
    return {"rounds": rounds, "ttfb_p50_ms": p50("ttfb"),
            "pipeline_first_chunk_p50_ms": p50("pipeline_first"),
            "ttfb_over_first_chunk_p50_ms": over, "target_ms": TARGET_MS,
            "paired_difference_p50_ms": round(paired, 1),
            "met": over <= TARGET_MS,
            "stream_end_p50_ms": p50("stream_end"), "sync_wall_p50_ms": p50("sync_wall"),
            "pipeline_all_chunks_p50_ms": p50("pipeline_last"),
            "ttfb_over_sync_wall": round(p50("ttfb") / p50("sync_wall"), 3),
            "bytes": rows[-1]["bytes"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    with local_stack('["piper-joe"]', "worker", ["worker", "--pipeline", "piper-joe"]) as st:
        print(json.dumps(measure(st.base_url, st.key, args.rounds), indent=2))

if __name__ == "__main__":
    main()
