"""bench.slots' workload and its service runs: one real ``omnijobs worker`` per slot
count over a fresh database, every job queued before the worker starts, the figures read
back from the jobs table and the fake engine's stats file (bench/slots.py says what
each figure means).
"""

from __future__ import annotations

import json
import math
import os
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from unittest import mock

import psycopg

from api.routes.speech import speech_job
from api.schemas import SpeechCreate
from core.settings import Settings
from storage.db import make_engine, make_sessionmaker
from storage.migrate import upgrade
from storage.records import NewJob
from storage.repositories import JobRepository, KeyRepository, OutboxRepository
from tasks.app import make_celery
from tasks.dispatch import publish_and_mark
from tests.fake_omni import STEP_BASE_S, STEP_PER_SEQ_S
from tests.services import ROOT, Process, spawn

from .services import BENCH_LIMITS, database

PIPELINE = "audex-tts"
FAKE_OPTIONS = {"engine_factory": "tests.fake_omni:make_engine",
                "tokenizer_factory": "tests.fake_omni:make_tokenizer"}
STEP_COST_ENV = "FAKE_OMNI_STEP_COST_S"
SECONDS_PER_WORD = 0.25  # how fast the fake speaks (tests/fake_omni.py, FakeOmni._audio)
FRAMES_PER_S = 50  # one codec frame per 320-sample hop at 16 kHz
GUIDED_CFG = 3.0
WORDS = ("the quick brown fox jumps over a lazy dog while seven bright kites drift "
         "above green hills and quiet rivers").split()
TERMINAL = ("completed", "failed", "cancelled")
POLL_S = 0.5


# ---- the workload ------------------------------------------------------------------------

@dataclass(frozen=True)
class Speech:
    """One job of the workload: its text and whether it is guided."""

    text: str
    guided: bool

    def body(self, response_format: str) -> dict:
        """The POST /v1/audio/speech body a client would send for it."""
        body = {"model": PIPELINE, "input": self.text, "response_format": response_format}
        return body | ({"cfg_scale": GUIDED_CFG} if self.guided else {})


def workload(jobs: int, seconds: float, guided_share: float) -> list[Speech]:
    """``jobs`` texts of ``seconds`` of fake speech each; the guided ones spread evenly
    through the queue (every fourth at 0.25), so no run sees them bunched at one end."""
    words = max(1, round(seconds / SECONDS_PER_WORD))
    out = []
    for i in range(jobs):
        text = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(words)).capitalize() + "."
        out.append(Speech(text, int((i + 1) * guided_share) > int(i * guided_share)))
    return out


# ---- figures -----------------------------------------------------------------------------

def percentile(values: list[float], q: float) -> float:
    """Nearest rank: with 200 values p99 is the second largest, a value that happened."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


@dataclass
class Outcome:
    """One run's measurements; the table and the JSON are made from these."""

    name: str
    jobs: int
    completed: int
    span_s: float
    latencies_s: list[float]
    peak_seqs: int | None
    overheads_ms: list[float] = field(default_factory=list)
    extra: dict = field(default_factory=dict)

    @property
    def jobs_per_hour(self) -> float:
        return self.completed * 3600 / self.span_s if self.span_s > 0 else 0.0

    def summary(self) -> dict:
        return {"name": self.name, "jobs": self.jobs, "completed": self.completed,
                "span_s": round(self.span_s, 3), "jobs_per_hour": round(self.jobs_per_hour, 1),
                "latency_p50_s": round(percentile(self.latencies_s, 50), 3),
                "latency_p99_s": round(percentile(self.latencies_s, 99), 3),
                "peak_seqs": self.peak_seqs,
                "overhead_p50_ms": _round(percentile(self.overheads_ms, 50)),
                "overhead_p99_ms": _round(percentile(self.overheads_ms, 99))}


def _round(value: float, digits: int = 2) -> float | None:
    return None if math.isnan(value) else round(value, digits)


# ---- the service runs --------------------------------------------------------------------

@dataclass
class Shared:
    """What every service run uses: one SeaweedFS, one redis-server (a database each)."""

    workdir: Path
    redis: object
    sw: object
    response_format: str
    runs: int = 0


def worker_env(pg: str, redis: str, shared: Shared, home: Path, slots: int,
               stats: Path) -> dict[str, str]:
    """Production mode on the fake engine, the slot count as the pipeline's ``slots``
    option and the engine's stats file in the run's folder. No FAKE_OMNI_STEP_COST_S: the
    engine takes the fake's named figures."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("OMNIJOBS_") and k != STEP_COST_ENV}
    options = {**FAKE_OPTIONS, "engine_kwargs": {"stats_file": str(stats)}, "slots": slots}
    env.update({
        "PYTHONPATH": str(ROOT), "OMNIJOBS_MODE": "production", "OMNIJOBS_HOME": str(home),
        "OMNIJOBS_DATABASE_URL": pg, "OMNIJOBS_BROKER_URL": redis,
        "OMNIJOBS_OBJECT_STORE": "s3", "OMNIJOBS_S3_ENDPOINT_URL": shared.sw.endpoint,
        "OMNIJOBS_S3_BUCKET": f"omnijobs-bench-slots-{shared.runs}",
        "OMNIJOBS_S3_ACCESS_KEY_ID": shared.sw.access_key,
        "OMNIJOBS_S3_SECRET_ACCESS_KEY": shared.sw.secret_key,
        "OMNIJOBS_SIGNING_SECRET": "benchmark-signing-secret-0123",
        "OMNIJOBS_PIPELINES": json.dumps([PIPELINE]),
        "OMNIJOBS_PIPELINE_OPTIONS": json.dumps({PIPELINE: options}),
        **BENCH_LIMITS,
    })
    return env


def settings_for(env: dict[str, str]):
    """The run's Settings, read from its environment without leaving it in ours."""
    with mock.patch.dict(os.environ, {k: v for k, v in env.items()
                                      if k.startswith("OMNIJOBS_")}):
        return Settings()


def queue_jobs(env: dict[str, str], work: list[Speech], response_format: str) -> list[str]:
    """Job rows and broker messages, as a submit writes them (the API's own request
    builder, one transaction per job, published at once); no API process."""
    settings = settings_for(env)
    engine = make_engine(settings.db_url)
    try:
        sessions = make_sessionmaker(engine)
        jobs, outbox = JobRepository(sessions), OutboxRepository(sessions)
        tenant, _ = KeyRepository(sessions).create_key("bench")
        app = make_celery(settings, with_tasks=False)
        ids = []
        for speech in work:
            spec, fields = speech_job(settings, SpeechCreate(**speech.body(response_format)))
            job, msg = jobs.create(NewJob(tenant_id=tenant, kind=spec.kind, model=PIPELINE,
                                          pipeline=spec.name, queue=spec.queue,
                                          request=fields, metadata=None, max_attempts=1))
            if not publish_and_mark(app, outbox, msg):
                raise RuntimeError("the broker refused a render message")
            ids.append(job.id)
        app.close()
        return ids
    finally:
        engine.dispose()


def drain_timeout_s(work: list[Speech], seconds: float) -> float:
    """Generous: three times a one-at-a-time drain at the fake's figures, plus start-up."""
    frames = seconds * FRAMES_PER_S
    return 180 + 3 * len(work) * frames * (STEP_BASE_S + 2 * STEP_PER_SEQ_S)


def wait_drained(pg: str, worker: Process, count: int, timeout: float) -> None:
    """Until every job is terminal; a worker that exits first, or a drain past
    ``timeout``, raises with the end of the worker's log."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(pg, autocommit=True) as conn:
        while True:
            done = conn.execute("SELECT count(*) FROM jobs WHERE status = ANY(%s)",
                                (list(TERMINAL),)).fetchone()[0]
            if done >= count:
                return
            if worker.proc.poll() is not None:
                raise RuntimeError(f"the worker exited ({worker.proc.returncode}) with "
                                   f"{count - done} jobs left:\n{worker.tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{count - done} of {count} jobs still open after "
                                   f"{timeout:.0f} s:\n{worker.tail()}")
            time.sleep(POLL_S)


def epoch(value: datetime | None) -> float | None:
    if value is None:
        return None
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()


def job_rows(pg: str) -> list[dict]:
    with psycopg.connect(pg, autocommit=True) as conn:
        rows = conn.execute("SELECT id, status, error_code, created_at, started_at, "
                            "completed_at FROM jobs").fetchall()
    return [{"id": r[0], "status": r[1], "error_code": r[2], "created": epoch(r[3]),
             "started": epoch(r[4]), "completed": epoch(r[5])} for r in rows]


def engine_stats(path: Path) -> dict:
    """The fake engine's stats file, its requests keyed by job id (the engine request id
    is ``<job id>-<8 hex>``); empty when the engine never wrote one."""
    if not path.is_file():
        return {"peak_seqs": None, "by_job": {}}
    data = json.loads(path.read_text())
    by_job = {rid.rsplit("-", 1)[0]: t for rid, t in data.get("requests", {}).items()}
    return {"peak_seqs": data.get("peak_seqs"), "steps": data.get("steps"), "by_job": by_job}


def service_outcome(name: str, rows: list[dict], stats: dict) -> Outcome:
    """The run's figures from the job rows and the engine's own timings."""
    done = [r for r in rows if r["status"] == "completed"]
    claims = [r["started"] for r in rows if r["started"] is not None]
    first = min(claims) if claims else math.nan
    span = max(r["completed"] for r in done) - first if done else 0.0
    latencies = [r["completed"] - max(r["created"], first) for r in done]
    overheads, before, after = [], [], []
    for r in done:
        times = stats["by_job"].get(r["id"])
        if times is not None:
            engine_s = times[-1] - times[0]
            overheads.append((r["completed"] - r["started"] - engine_s) * 1000)
            before.append((times[0] - r["started"]) * 1000)
            after.append((r["completed"] - times[-1]) * 1000)
    failed = sorted({f"{r['status']}:{r['error_code']}" for r in rows
                     if r["status"] != "completed"})
    extra = {"created_to_completed_p50_s": round(percentile(
                 [r["completed"] - r["created"] for r in done], 50), 3),
             "not_completed": failed, "engine_steps": stats.get("steps"),
             "engine_timed_jobs": len(overheads),
             # where the overhead lies: claim -> the request into the engine, and the
             # request out of the engine -> completed
             "claim_to_engine_p50_ms": _round(percentile(before, 50)),
             "engine_to_completed_p50_ms": _round(percentile(after, 50)),
             "claim_to_engine_ms": [round(v, 2) for v in before],
             "engine_to_completed_ms": [round(v, 2) for v in after],
             # every job's wall-clock times in claim order, the engine's (in, admitted,
             # out) beside them: a slow first wave or a stall shows where it happened
             "timeline": [{**r, "engine": stats["by_job"].get(r["id"])}
                          for r in sorted(rows, key=lambda r: r["started"] or math.inf)]}
    return Outcome(name, len(rows), len(done), span, latencies, stats["peak_seqs"],
                   overheads, extra)


def service_run(shared: Shared, work: list[Speech], slots: int, seconds: float) -> Outcome:
    """A fresh database, every job queued, then one worker started to drain them."""
    shared.runs += 1
    name = f"slots={slots}"
    home = shared.workdir / f"slots{slots}-{shared.runs}"
    home.mkdir()
    stats = home / "engine-stats.json"
    with ExitStack() as stack:
        pg = database(stack)
        upgrade(pg)
        env = worker_env(pg, shared.redis.db(shared.runs), shared, home, slots, stats)
        ids = queue_jobs(env, work, shared.response_format)
        worker = spawn("worker", ["worker", "--pipeline", PIPELINE], env, home)
        stack.callback(worker.stop)
        wait_drained(pg, worker, len(ids), drain_timeout_s(work, seconds))
        rows = job_rows(pg)
    return service_outcome(name, rows, engine_stats(stats))
