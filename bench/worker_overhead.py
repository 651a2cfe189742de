"""Worker overhead: claim -> completed for a pipeline that returns its clip at once.

Jobs for ``bench-clip`` (bench/pipelines.py: a fixed 2 s 16 kHz clip) are submitted one
at a time, each after the previous one finished, so no job waits behind another. The
job record's own timestamps give the figure, in microseconds: ``started_at`` is taken
just before the claim's compare-and-set and ``completed_at`` just before the completing
one, so ``completed_at - started_at`` spans the claim transaction, the lease thread's
start, generate (nothing) and aggregate, the hand-off to the finalize thread, the two
heartbeats finalize makes (before it starts and before the upload), validate, encode,
re-probe, verify and upload; not the completing transaction itself. From it we subtract
the median time to encode the same clip to WAV alone, in this process.

For the breakdown, this process also times the worker's own finalize step on the same
clip (validate, encode, re-probe, verify, upload to the same SeaweedFS) and its two
largest parts: what is left of claim -> completed beyond finalize is the bookkeeping
(claim, lease, hand-off, heartbeats).
"""

from __future__ import annotations

import statistics
import time
from types import SimpleNamespace

import httpx
import psycopg

from .report import Figure

BODY = {"model": "bench-clip", "input": "a fixed clip", "response_format": "wav"}
TARGET_MS = 15.0
ENCODE_RUNS = 50


def _median_ms(call, runs: int = ENCODE_RUNS) -> float:
    call()  # warm: codecs, the S3 client's connection
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def in_process_ms(env: dict[str, str]) -> dict[str, float]:
    """Medians, in this process, on the same clip: the WAV encode alone, the worker's
    whole finalize step (tasks.finalize.finalize_speech) against the run's object store,
    and its two largest parts, re-probing the encoded bytes and the upload."""
    from core.settings import Settings
    from media.audio import Audio
    from media.encode import encode_audio
    from media.probe import probe_audio
    from pipelines import get_spec
    from storage.objects import make_store
    from tasks.finalize import finalize_speech

    from .pipelines import CLIP_RATE, fixed_clip

    s3 = {name: env[f"OMNIJOBS_{name.upper()}"] for name in (
        "object_store", "s3_endpoint_url", "s3_bucket", "s3_access_key_id",
        "s3_secret_access_key")}
    store, spec = make_store(Settings(**s3)), get_spec("bench-clip")
    audio = Audio(samples=fixed_clip()[None, :], sample_rate=CLIP_RATE)
    wav = encode_audio(audio, "wav").data
    job = SimpleNamespace(id="job_bench_finalize", tenant_id="bench", attempts=1)  # its key
    return {
        "encode_alone_p50_ms": _median_ms(lambda: encode_audio(audio, "wav")),
        "finalize_alone_p50_ms": _median_ms(
            lambda: finalize_speech(store, job, spec, audio, "wav")),
        "probe_p50_ms": _median_ms(lambda: probe_audio(
            wav, container_format="wav", raw_rate=CLIP_RATE, raw_channels=1)),
        "upload_p50_ms": _median_ms(lambda: store.put("bench/upload.wav", wav, "audio/wav")),
    }


def _wait_terminal(conn: psycopg.Connection, job_id: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = conn.execute("SELECT status FROM jobs WHERE id = %s", (job_id,)).fetchone()
        if row and row[0] in ("completed", "failed", "cancelled"):
            return row[0]
        time.sleep(0.01)
    raise TimeoutError(f"job {job_id} did not finish in {timeout}s")


def run_jobs(base_url: str, key: str, database_url: str, jobs: int) -> list[float]:
    """(completed_at - started_at) in ms for ``jobs`` sequential bench-clip jobs."""
    headers = {"Authorization": f"Bearer {key}", "Prefer": "respond-async"}
    spans = []
    with httpx.Client(base_url=base_url, headers=headers, timeout=60) as client, \
            psycopg.connect(database_url, autocommit=True) as conn:
        for i in range(jobs + 1):  # the first one warms the worker up and is not counted
            response = client.post("/v1/audio/speech", json=BODY)
            if response.status_code != 202:
                raise RuntimeError(f"submit answered {response.status_code}: "
                                   f"{response.text[:300]}")
            job_id = response.json()["id"]
            status = _wait_terminal(conn, job_id)
            if status != "completed":
                raise RuntimeError(f"bench-clip job {job_id} ended {status}")
            started, completed = conn.execute(
                "SELECT started_at, completed_at FROM jobs WHERE id = %s", (job_id,)).fetchone()
            if i:
                spans.append((completed - started).total_seconds() * 1000)
    return spans


def measure(base_url: str, key: str, database_url: str, jobs: int,
            env: dict[str, str]) -> dict:
    spans = run_jobs(base_url, key, database_url, jobs)
    local = in_process_ms(env)
    p50 = statistics.median(spans)
    return {"jobs": jobs, "claim_to_completed_p50_ms": round(p50, 2),
            **{k: round(v, 3) for k, v in local.items()},
            "overhead_ms": round(p50 - local["encode_alone_p50_ms"], 2),
            "bookkeeping_ms": round(p50 - local["finalize_alone_p50_ms"], 2),
            "claim_to_completed_ms": [round(s, 2) for s in spans]}


def figure(data: dict) -> Figure:
    p50, enc, overhead = (data["claim_to_completed_p50_ms"], data["encode_alone_p50_ms"],
                          data["overhead_ms"])
    return Figure(key="worker_overhead",
                  name="worker: claim → completed, fixed 2 s 16 kHz clip (wav), p50",
                  target=f"≤ {TARGET_MS:.0f} ms beyond the WAV encode",
                  measured=f"{p50:.1f} ms (WAV encode alone: {enc:.2f} ms; overhead "
                           f"{overhead:.1f} ms, of which re-probe "
                           f"{data['probe_p50_ms']:.1f} ms and upload "
                           f"{data['upload_p50_ms']:.1f} ms)",
                  ratio=f"{p50 / enc:.0f}x" if enc else "-", met=overhead <= TARGET_MS,
                  data=data)
