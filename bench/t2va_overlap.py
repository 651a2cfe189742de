"""Does finalize stay off the GPU's critical path?

One GPU worker serves a synthetic T2VA pipeline that holds the "GPU" for G seconds
per job and returns a 10.125 s 448x256 24 fps clip with 32 kHz stereo audio. Finalize
(validate, H.264/AAC mux, re-probe, upload to SeaweedFS) is real. We measure:

- P: the finalize time of one job, alone (median of several runs), and its peak memory;
- jobs/min for 20 jobs through the real API-less path (job rows + broker messages,
  a real Celery worker, PostgreSQL, Redis, SeaweedFS);
and compare with the serial bound 60/(G+P) and the ideal 60/max(G,P).

Run: .venv/bin/python -m bench.t2va_overlap [--jobs 20]
Needs PostgreSQL and Redis as for the tests; starts SeaweedFS itself.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from datetime import UTC
from pathlib import Path

from core.settings import Settings
from pipelines import VideoRequest, get_spec, import_pipeline_modules
from storage.db import make_engine, make_sessionmaker
from storage.migrate import upgrade
from storage.objects import S3Store
from storage.records import JobRecord, NewJob
from storage.repositories import JobRepository, KeyRepository, OutboxRepository
from tasks.app import make_celery
from tasks.dispatch import publish_and_mark
from tasks.finalize import finalize_video
from tests.services import (
    ROOT,
    create_database,
    drop_database,
    redis_url,
    spawn,
    start_seaweedfs,
    wait_until,
)

from .pipelines import GPU_SECONDS, SECONDS, synthetic_clip

REQUEST = {"prompt": "bench", "seconds": SECONDS, "size": "448x256", "fps": 24, "n": 1,
           "generate_audio": True}


def settings_env(pg: str, redis: str, sw, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNIJOBS_")}
    env.update({
        "PYTHONPATH": str(ROOT), "OMNIJOBS_MODE": "production", "OMNIJOBS_HOME": str(home),
        "OMNIJOBS_DATABASE_URL": pg, "OMNIJOBS_BROKER_URL": redis,
        "OMNIJOBS_OBJECT_STORE": "s3", "OMNIJOBS_S3_ENDPOINT_URL": sw.endpoint,
        "OMNIJOBS_S3_BUCKET": "omnijobs-bench", "OMNIJOBS_S3_ACCESS_KEY_ID": sw.access_key,
        "OMNIJOBS_S3_SECRET_ACCESS_KEY": sw.secret_key,
        "OMNIJOBS_SIGNING_SECRET": "benchmark-signing-secret-0123",
        "OMNIJOBS_PIPELINES": '["bench-t2va"]', "OMNIJOBS_PIPELINE_MODULES": '["bench.pipelines"]',
        "OMNIJOBS_LEASE_S": "60",
    })
    return env


class RssSampler:
    """Peak resident memory over a block, sampled from /proc every 5 ms (ru_maxrss is a
    process-lifetime maximum, which earlier allocations would hide)."""

    def __init__(self) -> None:
        import threading

        self.peak = self.baseline = self.current()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def current() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self.current())

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.current())


def finalize_stats(runs: int) -> dict:
    """In this (fresh) process: finalize one job at a time; time, Python peak, RSS growth."""
    from datetime import datetime

    from core.jobs import JobKind, JobStatus

    import_pipeline_modules(["bench.pipelines"])
    store, spec = S3Store(Settings()), get_spec("bench-t2va")
    request = VideoRequest.from_dict(REQUEST)
    now = datetime.now(UTC)
    job = JobRecord(id="video_bench", tenant_id="bench", kind=JobKind.VIDEO,
                    model="bench-t2va", pipeline="bench-t2va", status=JobStatus.RUNNING,
                    progress=0, request=REQUEST, metadata=None, attempts=1, max_attempts=1,
                    error_code=None, error_message=None, created_at=now, updated_at=now,
                    started_at=now, completed_at=None, lease_expires_at=None)
    warm = synthetic_clip()
    with RssSampler() as cold:  # first run: codec, muxer and client start-up included
        finalize_video(store, job, spec, warm, request)
    del warm
    times, py_peaks, rss_growth = [], [], []
    for _ in range(runs):
        result = synthetic_clip()
        tracemalloc.start()
        with RssSampler() as rss:
            started = time.perf_counter()
            finalize_video(store, job, spec, result, request)
            times.append(time.perf_counter() - started)
        py_peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        rss_growth.append(rss.peak - rss.baseline)
        del result
    clip_mb = synthetic_clip().videos.nbytes / 2**20
    return {"p_s": statistics.median(times), "p_all": times,
            "py_peak_mb": max(py_peaks) / 2**20, "rss_growth_mb": max(rss_growth) / 2**20,
            "clip_mb": clip_mb, "cold_rss_growth_mb": (cold.peak - cold.baseline) / 2**20,
            "rss_max_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def measure_finalize(env: dict[str, str], runs: int) -> dict:
    out = subprocess.run([sys.executable, "-m", "bench.t2va_overlap", "--finalize-only",
                          "--finalize-runs", str(runs)], env=env, cwd=ROOT,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_jobs(env: dict[str, str], home: Path, count: int) -> dict:
    os.environ.update({k: v for k, v in env.items() if k.startswith("OMNIJOBS_")})
    settings = Settings()
    import_pipeline_modules(settings.pipeline_modules)
    sessions = make_sessionmaker(make_engine(settings.db_url))
    jobs, outbox = JobRepository(sessions), OutboxRepository(sessions)
    tenant, _ = KeyRepository(sessions).create_key("bench")
    spec = get_spec("bench-t2va")
    worker = spawn("bench-worker", ["worker", "--pipeline", "bench-t2va"],
                   env, home)
    try:
        wait_until(lambda: "ready" in worker.log.read_text(), 120, "bench worker")
        app = make_celery(settings)
        ids = []
        for _ in range(count):
            job, msg = jobs.create(NewJob(tenant_id=tenant, kind=spec.kind, model=spec.name,
                                          pipeline=spec.name, queue=spec.queue,
                                          request=REQUEST, metadata=None, max_attempts=1))
            publish_and_mark(app, outbox, msg)
            ids.append(job.id)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            done = [jobs.get(i) for i in ids]
            if all(j.status.terminal for j in done):
                break
            time.sleep(0.5)
    finally:
        worker.stop()
    statuses = {j.status.value for j in done}
    start = min(j.started_at for j in done)
    end = max(j.completed_at for j in done)
    span = (end - start).total_seconds()
    return {"statuses": sorted(statuses), "span_s": span, "jobs_per_min": count * 60 / span}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--finalize-runs", type=int, default=5)
    parser.add_argument("--finalize-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.finalize_only:
        print(json.dumps(finalize_stats(args.finalize_runs)))
        return
    home = Path(tempfile.mkdtemp(prefix="omnijobs-bench-"))
    pg = create_database()
    upgrade(pg)
    sw = start_seaweedfs(home / "seaweedfs")
    try:
        env = settings_env(pg, redis_url(), sw, home)
        fin = measure_finalize(env, args.finalize_runs)
        run = run_jobs(env, home, args.jobs)
    finally:
        sw.stop()
        drop_database(pg)
    g, p = GPU_SECONDS, fin["p_s"]
    report = {
        "G_s": g, "P_s": round(p, 3), "P_runs_s": [round(x, 3) for x in fin["p_all"]],
        "jobs": args.jobs, "statuses": run["statuses"], "span_s": round(run["span_s"], 2),
        "measured_jobs_per_min": round(run["jobs_per_min"], 2),
        "serial_bound_jobs_per_min": round(60 / (g + p), 2),
        "ideal_jobs_per_min": round(60 / max(g, p), 2),
        "finalize_python_peak_mb": round(fin["py_peak_mb"], 1),
        "finalize_rss_peak_growth_mb": round(fin["rss_growth_mb"], 1),
        "finalize_cold_rss_peak_growth_mb": round(fin["cold_rss_growth_mb"], 1),
        "input_clip_mb": round(fin["clip_mb"], 1),
        "finalize_process_max_rss_mb": round(fin["rss_max_mb"], 1),
        "cpu_count": os.cpu_count(),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
