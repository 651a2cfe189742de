"""How fast does a 50,000-line speech batch get from upload to all its jobs queued?

A real deployment (API process, the maintenance process, PostgreSQL, Redis,
SeaweedFS; no render worker, so every job stays queued) takes a 50,000-line
``/v1/audio/speech`` batch through the openai SDK: upload, create, then wait until the
batch is ``in_progress`` and its 50,000 render messages are in the Redis bulk lane.
Side by side in the same run, the baseline: the same requests submitted one at a time to
``POST /v1/audio/speech`` (``Prefer: respond-async``), on a sample, per job. Then where the
time goes (the maintenance step's parts, timed in this process on a second batch of the
same file), and the API's peak memory while a large batch file (default 190 MB) is
uploaded.

Run: .venv/bin/python -m bench.batch_enqueue [--lines 50000] [--sample 500] [--upload-mb 190]
Needs PostgreSQL and Redis as for the tests; starts SeaweedFS itself.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import time
from pathlib import Path

import httpx
import redis
from openai import OpenAI

from tests.services import Process

from .stack import local_stack

BULK_KEY = "pipeline.piper-joe\x06\x169"  # kombu's Redis list for priority 9


def line(i: int, text: str) -> bytes:
    return json.dumps({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/audio/speech",
                       "body": {"model": "tts-1", "voice": "alloy", "response_format": "mp3",
                                "input": text}}).encode() + b"\n"


def peak_rss_mb(proc: Process) -> float:
    """VmHWM of the worker or API process (the supervisor's child for a worker)."""
    pids = [proc.proc.pid, *(int(p) for p in Path(f"/proc/{proc.proc.pid}/task").glob(
        "*/children") for p in p.read_text().split())]
    peaks = []
    for pid in pids:
        for row in Path(f"/proc/{pid}/status").read_text().splitlines():
            if row.startswith("VmHWM:"):
                peaks.append(int(row.split()[1]) / 1024)
    return max(peaks)


def requests(lines: int) -> bytes:
    return b"".join(line(i, f"Sentence number {i} of the bulk benchmark.")
                    for i in range(lines))


def enqueue(sdk: OpenAI, broker: redis.Redis, lines: int) -> dict:
    data = requests(lines)
    started = time.perf_counter()
    source = sdk.files.create(file=("bulk.jsonl", io.BytesIO(data)), purpose="batch")
    uploaded = time.perf_counter()
    batch = sdk.batches.create(input_file_id=source.id, endpoint="/v1/audio/speech",
                               completion_window="24h")
    created = time.perf_counter()
    while sdk.batches.retrieve(batch.id).status == "validating":
        time.sleep(0.1)  # each poll costs the API (and this 2-core machine) some CPU
    committed = time.perf_counter()
    while broker.llen(BULK_KEY) < lines:
        time.sleep(0.02)
    queued = time.perf_counter()
    final = sdk.batches.retrieve(batch.id)
    assert final.status == "in_progress" and final.request_counts.total == lines, final
    return {"file_mb": round(len(data) / 2**20, 1), "upload_s": round(uploaded - started, 2),
            "create_s": round(created - uploaded, 2),
            "created_to_jobs_committed_s": round(committed - created, 2),
            "committed_to_all_published_s": round(queued - committed, 2),
            "upload_to_all_queued_s": round(queued - started, 2),
            "per_job_us": round((queued - started) / lines * 1e6, 1)}


def interactive(base: str, key: str, sample: int) -> dict:
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}",
                                               "Prefer": "respond-async"}, timeout=60) as c:
        started = time.perf_counter()
        for i in range(sample):
            resp = c.post("/v1/audio/speech", json={
                "model": "tts-1", "voice": "alloy", "response_format": "mp3",
                "input": f"Sentence number {i} of the bulk benchmark."})
            assert resp.status_code == 202, resp.text
        spent = time.perf_counter() - started
    return {"sample": sample, "seconds": round(spent, 2),
            "per_job_us": round(spent / sample * 1e6, 1)}


def breakdown(env: dict[str, str], text: bytes, lines: int) -> dict:
    """The step's parts, in this process: parse and check, insert and commit, publish,
    mark published."""
    os.environ.update({k: v for k, v in env.items() if k.startswith("OMNIJOBS_")})
    from api.batch_lines import line_checker
    from core.batches import BatchStatus
    from core.settings import Settings
    from storage.db import make_engine, make_sessionmaker
    from storage.records import NewFile
    from storage.repositories import KeyRepository
    from storage.repositories.files import file_key, new_file_id
    from tasks.app import make_celery
    from tasks.batch_validate import LEASE_S, checked_lines, stored_lines
    from tasks.lanes import publish_bulk
    from tasks.runtime import get_runtime

    settings = Settings()
    rt, app = get_runtime(settings), make_celery(settings)
    tenant, _ = KeyRepository(make_sessionmaker(make_engine(settings.db_url))).create_key(
        "bench-parts")
    file_id = new_file_id()
    rt.store.put(file_key(tenant, file_id), text, "application/jsonl")
    rt.files.create(NewFile(id=file_id, tenant_id=tenant, purpose="batch", filename="b",
                            bytes=len(text), key=file_key(tenant, file_id)))
    batch = rt.batches.create(tenant, endpoint="/v1/audio/speech", input_file_id=file_id,
                              completion_window="24h", metadata=None, max_active=100)
    times = {}
    started = time.perf_counter()
    checked = list(checked_lines(stored_lines(rt.store, file_key(tenant, file_id)), batch,
                                 line_checker(settings), lines))
    times["parse_and_check_s"] = time.perf_counter() - started
    token = rt.batches.take(batch.id, BatchStatus.VALIDATING, LEASE_S)
    started = time.perf_counter()
    queued = rt.batches.expand(batch.id, token, iter(checked))
    times["insert_and_commit_s"] = time.perf_counter() - started
    started = time.perf_counter()
    publish_bulk(app, queued)
    times["publish_s"] = time.perf_counter() - started
    started = time.perf_counter()
    rt.batches.mark_published(batch.id)
    times["mark_published_s"] = time.perf_counter() - started
    return {k: round(v, 2) for k, v in times.items()}


def upload_memory(sdk: OpenAI, api: Process, megabytes: int, home: Path) -> dict:
    """Peak API memory while a large file goes up (streamed to the store, never whole)."""
    path = home / "big.jsonl"
    text = "A long narration line for the upload benchmark. " * 80
    with path.open("wb") as f:
        i = 0
        while f.tell() < megabytes * 2**20:
            f.write(line(i, text))
            i += 1
    before = peak_rss_mb(api)
    started = time.perf_counter()
    with path.open("rb") as f:
        made = sdk.files.create(file=("big.jsonl", f), purpose="batch")
    return {"file_mb": round(made.bytes / 2**20, 1),
            "upload_s": round(time.perf_counter() - started, 2),
            "api_peak_rss_before_mb": round(before, 1),
            "api_peak_rss_after_mb": round(peak_rss_mb(api), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=50_000)
    parser.add_argument("--sample", type=int, default=500)
    parser.add_argument("--upload-mb", type=int, default=190)
    args = parser.parse_args()
    with local_stack('["piper-joe", "test-silent"]', "maintenance", ["maintenance"],
                     ready_s=90) as st:
        sdk = OpenAI(base_url=st.base_url + "/v1", api_key=st.key, max_retries=0, timeout=600)
        report = {"lines": args.lines, "cpu_count": os.cpu_count(),
                  "batch": enqueue(sdk, redis.Redis.from_url(st.broker_url), args.lines),
                  "maintenance_peak_rss_mb": round(peak_rss_mb(st.procs["maintenance"]), 1),
                  "interactive": interactive(st.base_url, st.key, args.sample)}
        report["interactive_over_batch_per_job"] = round(
            report["interactive"]["per_job_us"] / report["batch"]["per_job_us"], 1)
        st.procs["maintenance"].stop()  # the parts are timed here, on a batch of our own
        report["step_parts"] = breakdown(st.env, requests(args.lines), args.lines)
        if args.upload_mb:
            report["large_upload"] = upload_memory(sdk, st.procs["api"], args.upload_mb,
                                                   st.home)
        print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
