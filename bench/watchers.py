"""Many watchers on one API process: event streams and synchronous waits.

``python -m bench.watchers [--streams 2000] [--waits 500] [--rate 100]``: one
``omnijobs api`` (production mode: PostgreSQL, Redis, SeaweedFS), ``--streams`` clients
on ``GET /v1/jobs/{id}/events`` of as many queued jobs and ``--waits`` synchronous
``POST /v1/audio/speech``. No render worker: once every watcher is idle, a completer
process finishes the jobs itself, as a worker would (claim, output object, the
completing transaction, then the notice on the bus), ``--rate`` a second in random order.

Figures: per watcher, from the completing transaction's commit to the first byte that
reports it (the stream's ``completed`` status event, the wait's response), p50/p99/max;
the API process's resident memory per idle stream and per idle wait (its growth over
the idle watchers, divided by their number); its threads and its database connections
(``pg_stat_activity``, busy ones apart) sampled all along. The client reads raw sockets
in one event loop, so its own cost per byte is small beside the server's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import queue
import random
import resource
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path

import psycopg

from tests.services import ROOT

from . import services as svc

COMPLETED = b'"status":"completed"'
# ``--tracemalloc``: the API with a snapshot written on each SIGUSR1, tracing from the
# first (the handler runs in the event loop's thread, between two callbacks).
TRACED_API = """
import os, signal, sys, tracemalloc
taken = []
def dump(*_):
    if not taken:  # tracing starts here: what the watchers add is all that is traced
        tracemalloc.start(6)
    taken.append(1)
    tracemalloc.take_snapshot().dump(os.environ["BENCH_SNAPSHOT"] + str(len(taken)))
signal.signal(signal.SIGUSR1, dump)
sys.argv = ["omnijobs", *sys.argv[1:]]
from omnijobs.cli import main
main()
"""
WAV = b"RIFF" + bytes(40)  # the waits' answer: any bytes will do, the store returns them


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


class Sampler(threading.Thread):
    """The API process's threads and its database connections, every 100 ms."""

    def __init__(self, pid: int, pg: str) -> None:
        super().__init__(daemon=True)
        self.pid, self.pg = pid, pg
        self.phase = "start"
        self.samples: list[dict] = []
        self.done = threading.Event()

    def run(self) -> None:
        name = self.pg.rsplit("/", 1)[1]
        with psycopg.connect(self.pg.rsplit("/", 1)[0] + "/postgres", autocommit=True) as c:
            while not self.done.wait(0.1):
                conns, busy = c.execute(
                    "SELECT count(*), count(*) FILTER (WHERE state <> 'idle') "
                    "FROM pg_stat_activity WHERE datname = %s AND application_name "
                    "NOT LIKE 'bench%%'", (name,)).fetchone()
                self.samples.append({"phase": self.phase, "threads": len(os.listdir(
                    f"/proc/{self.pid}/task")), "conns": conns, "busy": busy})

    def peak(self, phase: str) -> dict:
        rows = [s for s in self.samples if s["phase"] == phase] or [{}]
        return {k: max(r.get(k, 0) for r in rows) for k in ("threads", "conns", "busy")}


def complete_jobs(env: dict, ids: list[tuple[str, bool]], rate: float, out) -> None:
    """The completer process: each job claimed, its output stored (for a wait, which
    returns the bytes), completed and announced; sends (job id, commit wall time)."""
    os.environ.update({k: v for k, v in env.items() if k.startswith("OMNIJOBS_")})
    from core.settings import Settings
    from storage.bus import make_bus
    from storage.db import make_engine, make_sessionmaker
    from storage.objects import make_store
    from storage.records import OutputRecord
    from storage.repositories import JobRepository

    settings = Settings()
    url = settings.db_url + ("&" if "?" in settings.db_url else "?") + \
        "application_name=bench-completer"
    jobs = JobRepository(make_sessionmaker(make_engine(url)))
    store, bus = make_store(settings), make_bus(settings)
    start = time.monotonic()
    for n, (job_id, waited) in enumerate(ids):
        time.sleep(max(0.0, start + n / rate - time.monotonic()))
        job = jobs.claim(job_id, "bench-completer", 600.0)
        key = f"bench/{job_id}.wav"
        if waited:
            store.put(key, WAV, "audio/wav")
        jobs.complete(job_id, job.attempts, [OutputRecord(
            index=0, key=key, content_type="audio/wav", bytes=len(WAV), sha256="0" * 64,
            duration_s=0.1, sample_rate=16000, channels=1)], 3600.0)
        at = time.time()
        bus.notify(job_id)
        out.put((job_id, at))
    out.put(None)


class Clients:
    """The watchers: raw HTTP/1.1 on asyncio streams."""

    def __init__(self, port: int, key: str) -> None:
        self.port, self.key = port, key
        self.connected: set[str] = set()
        self.seen: dict[str, float] = {}  # job (or wait label) -> wall time of the news
        self.errors: list[str] = []

    async def stream(self, job_id: str) -> None:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            writer.write(f"GET /v1/jobs/{job_id}/events HTTP/1.1\r\nHost: bench\r\n"
                         f"Authorization: Bearer {self.key}\r\n\r\n".encode())
            buf = b""
            while True:
                data = await reader.read(65536)
                if not data:
                    raise ConnectionError("stream closed before the job completed")
                buf += data
                if job_id not in self.connected and b"event: status" in buf:
                    self.connected.add(job_id)
                if COMPLETED in buf:
                    self.seen[job_id] = time.time()
                    break
                buf = buf[-256:]
            writer.close()
        except Exception as exc:
            self.errors.append(f"stream {job_id}: {exc!r}"[:200])

    async def wait(self, label: str) -> None:
        body = json.dumps({"model": "tts-1", "input": "Hello there.", "voice": "alloy",
                           "response_format": "wav", "metadata": {"bench": label}}).encode()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            writer.write(f"POST /v1/audio/speech HTTP/1.1\r\nHost: bench\r\n"
                         f"Authorization: Bearer {self.key}\r\nContent-Type: "
                         f"application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                         + body)
            head = await reader.readuntil(b"\r\n")
            self.seen[label] = time.time()
            if b" 200 " not in head:
                self.errors.append(f"wait {label}: {head[:60]!r}")
            writer.close()
        except Exception as exc:
            self.errors.append(f"wait {label}: {exc!r}"[:200])


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))] if s else float("nan")


async def until(check, timeout: float, what: str, progress=None) -> None:
    start = time.monotonic()
    while not check():
        if time.monotonic() > start + timeout:
            raise RuntimeError(f"timed out waiting for {what}"
                               + (f" ({progress()})" if progress else ""))
        await asyncio.sleep(0.1)
    print(f"{what}: {time.monotonic() - start:.1f} s", flush=True)


def snapshot(pid: int, path: str, n: int) -> None:
    """Ask the traced API for its ``n``-th snapshot; back once the file stops growing."""
    os.kill(pid, signal.SIGUSR1)
    target, size, deadline = Path(f"{path}{n}"), -1, time.monotonic() + 300
    while not target.exists() or target.stat().st_size != size:
        if time.monotonic() > deadline:
            raise RuntimeError("no tracemalloc snapshot")
        size = target.stat().st_size if target.exists() else -1
        time.sleep(1.0)


def where_memory_goes(path: str, per: int, top: int = 12) -> list[str]:
    """Allocation sites that grew between the first two snapshots, per watcher."""
    import tracemalloc

    old, new = (tracemalloc.Snapshot.load(f"{path}{n}") for n in (1, 2))
    stats = new.compare_to(old, "traceback")[:top]
    return [f"{st.size_diff / per / 1024:.2f} KiB/stream, {st.count_diff / per:.1f} blocks: "
            + " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in st.traceback[:4])
            for st in stats]


async def complete_all(env: dict, work: list[tuple[str, bool]], args) -> dict[str, float]:
    """Run the completer processes; each job's commit time, as they report it."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    completers = [ctx.Process(target=complete_jobs, args=(
        env, work[i::args.completers], args.rate / args.completers, results))
        for i in range(args.completers)]
    for c in completers:
        c.start()
    committed: dict[str, float] = {}
    loop = asyncio.get_running_loop()
    ended = 0
    while ended < len(completers):
        try:  # a bounded get: a thread left blocked would hold up the exit on Ctrl-C
            item = await loop.run_in_executor(None, results.get, True, 1.0)
        except queue.Empty:
            continue
        if item is None:
            ended += 1
        else:
            committed[item[0]] = item[1]
    for c in completers:
        c.join()
    return committed


async def run(args, base: str, key: str, pid: int, pg: str, env: dict) -> dict:
    from core.jobs import JobKind
    from storage.db import make_engine, make_sessionmaker
    from storage.records import NewJob
    from storage.repositories import JobRepository, KeyRepository

    port = int(base.rsplit(":", 1)[1])
    sessions = make_sessionmaker(make_engine(pg))
    tenant = KeyRepository(sessions).authenticate(key)
    jobs = JobRepository(sessions)
    new = NewJob(tenant_id=tenant, kind=JobKind.SPEECH, model="tts-1", pipeline="piper-joe",
                 queue="render.piper-joe", request={"input": "hi"}, metadata=None,
                 max_attempts=3)
    stream_ids = [r[0].id for i in range(0, args.streams, 500)
                  for r in jobs.create_many([new] * min(500, args.streams - i))]
    clients = Clients(port, key)
    sampler = Sampler(pid, pg)
    sampler.start()
    await asyncio.sleep(1.0)
    if args.tracemalloc:
        await asyncio.to_thread(snapshot, pid, env["BENCH_SNAPSHOT"], 1)
    base_rss = rss_kib(pid)
    sampler.phase = "streams"
    tasks = []
    for i in range(0, len(stream_ids), 100):  # in steps, within the listen backlog
        tasks += [asyncio.create_task(clients.stream(j)) for j in stream_ids[i:i + 100]]
        await asyncio.sleep(0.05)
    await until(lambda: len(clients.connected) + len(clients.errors) >= len(stream_ids),
                args.timeout,
                "the streams", lambda: f"{len(clients.connected)} connected, "
                f"{len(clients.errors)} failed: {clients.errors[:3]}")
    await asyncio.sleep(args.settle)
    streams_rss = rss_kib(pid)
    print(f"idle streams: {(streams_rss - base_rss) / max(1, args.streams):.1f} KiB each; "
          f"peaks {sampler.peak('streams')}", flush=True)
    if args.tracemalloc:
        await asyncio.to_thread(snapshot, pid, env["BENCH_SNAPSHOT"], 2)
        sites = where_memory_goes(env["BENCH_SNAPSHOT"], args.streams)
        for t in tasks:
            t.cancel()
        sampler.done.set()
        return {"streams": args.streams, "kib_per_stream_rss": (streams_rss - base_rss)
                / args.streams, "tracemalloc_per_stream": sites}
    sampler.phase = "waits"
    labels = [f"w{i}" for i in range(args.waits)]
    for i in range(0, len(labels), 100):
        tasks += [asyncio.create_task(clients.wait(label)) for label in labels[i:i + 100]]
        await asyncio.sleep(0.05)
    wait_ids: dict[str, str] = {}

    def waits_stored() -> bool:
        with psycopg.connect(pg + "?application_name=bench-client") as c:
            wait_ids.update(c.execute("SELECT id, metadata->>'bench' FROM jobs WHERE "
                                      "metadata->>'bench' IS NOT NULL").fetchall())
        return len(wait_ids) + len(clients.errors) >= args.waits
    await until(waits_stored, args.timeout, "the waits' jobs")
    await asyncio.sleep(args.settle)
    idle_rss = rss_kib(pid)
    sampler.phase = "completing"
    work = [(j, False) for j in stream_ids] + [(j, True) for j in wait_ids]
    random.Random(7).shuffle(work)
    work = work[:args.complete]  # the others keep watching, idle, to the end
    committed = await complete_all(env, work, args)
    await asyncio.wait(tasks, timeout=10)
    for t in tasks:
        t.cancel()
    sampler.phase = "end"
    sampler.done.set()
    sampler.join()
    lat = {"stream": [], "wait": []}
    for job_id, at in committed.items():
        label = wait_ids.get(job_id)
        seen = clients.seen.get(label if label else job_id)
        if seen is not None:
            lat["wait" if label else "stream"].append((seen - at) * 1000)
    return {
        "streams": args.streams, "waits": args.waits, "rate_per_s": args.rate,
        "completed": len(committed),
        "errors": clients.errors[:20], "error_count": len(clients.errors),
        "latency_ms": {k: {"n": len(v), "p50": pct(v, .5), "p99": pct(v, .99),
                           "max": max(v, default=float("nan")),
                           "mean": statistics.fmean(v) if v else float("nan")}
                       for k, v in (*lat.items(), ("all", lat["stream"] + lat["wait"]))},
        "rss_kib": {"base": base_rss, "streams_idle": streams_rss, "waits_idle": idle_rss},
        "kib_per_stream": (streams_rss - base_rss) / max(1, args.streams),
        "kib_per_wait": (idle_rss - streams_rss) / max(1, args.waits),
        "peaks": {p: sampler.peak(p) for p in ("start", "streams", "waits", "completing")},
    }


def start_traced_api(tree: svc.Tree, env: dict, home: Path):
    port = svc.free_port()
    process = svc.spawn("api", [sys.executable, "-c", TRACED_API, "api", "--port",
                                str(port)], env, tree.path, home)
    base = f"http://127.0.0.1:{port}"
    svc.wait_ready(process, svc.http_ok(f"{base}/readyz"), 180)
    return process, base


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=2000)
    ap.add_argument("--waits", type=int, default=500)
    ap.add_argument("--rate", type=float, default=100.0, help="completions per second")
    ap.add_argument("--complete", type=int, default=500,
                    help="jobs completed (at random among the watched ones)")
    ap.add_argument("--completers", type=int, default=4, help="completing processes")
    ap.add_argument("--timeout", type=float, default=1200,
                    help="seconds the watchers may take to open (a busy machine is slow)")
    ap.add_argument("--settle", type=float, default=3.0, help="idle seconds before a reading")
    ap.add_argument("--tracemalloc", action="store_true",
                    help="only the idle streams' memory, with the allocation sites")
    ap.add_argument("--results-dir", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # clean up as on Ctrl-C
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 2 * (args.streams + args.waits) + 1024  # both ends live on this machine
    if soft < need:  # inherited by the API process
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(need, soft)), hard))
    args.results_dir.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        home = Path(tempfile.mkdtemp(prefix="omnijobs-watchers-"))
        stack.callback(shutil.rmtree, home, ignore_errors=True)
        pg = svc.database(stack)
        redis, sw = svc.start_redis(stack, home), svc.seaweedfs(stack, home)
        tree = svc.Tree(label=f"this tree ({svc.git_commit(ROOT)})", path=ROOT)
        env = {**svc.omnijobs_env(tree, pg, redis.db(1), sw, home),
               "OMNIJOBS_TENANT_MAX_STREAMS": str(args.streams + args.waits + 10),
               "OMNIJOBS_SYNC_WAIT_DEFAULT_S": "600", "OMNIJOBS_SYNC_WAIT_MAX_S": "600",
               "OMNIJOBS_EVENT_STREAM_MAX_S": "3600"}
        key = svc.prepare(tree, env)
        if args.tracemalloc:
            env["BENCH_SNAPSHOT"] = str(home / "snapshot")
            api, base = start_traced_api(tree, env, home)
        else:
            api, base = svc.start_api(tree, env, home)
        stack.callback(api.stop)
        result = asyncio.run(run(args, base, key, api.proc.pid, pg, env))
    result["tree"] = tree.label
    text = json.dumps(result, indent=1)
    print(text)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    (args.results_dir / f"watchers-{stamp}.json").write_text(text)


if __name__ == "__main__":
    main()
