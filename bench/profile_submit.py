"""Profile the omnijobs API under the submit load: where does a submit's time go?

    python -m bench.profile_submit [--duration 20s] [--connections 64]

Starts the same services as bench.fastpaths (no worker) and loads the API with ``hey``
(``POST /v1/audio/speech``, ``Prefer: respond-async``) twice while ``py-spy record
--nonblocking`` samples it: once with ``--gil`` (the CPU view: only the thread holding the
GIL) and once with ``--idle`` (every thread, busy or waiting: where requests wait).
Each sample is attributed to parts of the submit path and, in the second pass, to what
the thread was doing (waiting for a pooled connection, on PostgreSQL, on Redis, ...);
the totals are printed as milliseconds of thread time per accepted submit, beside the
server counters (transactions, sessions, Redis commands, API CPU per submit).

Writes the collapsed stacks (open them in speedscope.app, or render them with
flamegraph.pl / inferno) and the summary to ``bench/results/``. py-spy needs ptrace
rights over the API process (root, or CAP_SYS_PTRACE in a container).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections import Counter
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path

from .counters import SETTLE_S, Counters
from .load import SPEECH_BODY, hey_argv, parse_hey_csv, seconds, warm_up
from .services import (
    ROOT,
    Tree,
    database,
    omnijobs_env,
    prepare,
    seaweedfs,
    start_api,
    start_redis,
    workdir,
)
from .submit import PATH

RESULTS = ROOT / "bench" / "results"

RATE = 100  # samples per second per thread

# Parts of a submit, matched on "function (file" fragments of a frame; a sample counts
# once for each part any of its frames belongs to (parts may nest).
PARTS: dict[str, tuple[str, ...]] = {
    "auth: API key lookup (KeyRepository.authenticate)": ("authenticate (storage/",),
    "job + outbox insert (JobRepository.create)": ("create (storage/repositories/jobs.py",),
    "mark_published (second write transaction)": ("mark_published (storage/",),
    "Celery send_task (broker publish)": ("send_task (celery/",),
    "  of which the task-sent event": ("EventDispatcher.publish (celery/",),
    "SQLAlchemy pool checkout (incl. pre-ping)": ("_ConnectionRecord.checkout (sqlalchemy/",),
    "  of which pre-ping": ("do_ping (sqlalchemy/",),
    "new database connections": ("connect (psycopg/connection.py",),
    "thread pool hop (anyio to_thread)": ("run_sync (anyio/to_thread.py",
                                          "run_sync_in_worker_thread (anyio/"),
    "logging (access log, JSON formatter)": ("Handler.handle (logging/",),
    "pydantic request validation": ("_validate_body (fastapi", "request_body_to_args (fastapi"),
    "response: job_view + JSON": ("job_view (storage/views.py", "accepted (api/routes/speech"),
}

# What a thread is doing in a sample taken with --idle: the first rule that matches wins.
STATES: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    # (state, a frame contains one of, and the leaf contains one of ("" = any))
    ("waiting for a pooled database connection", ("QueuePool._do_get",), ("Condition.wait",)),
    ("waiting for a broker producer (kombu pool)", ("Resource.acquire (kombu",),
     ("Condition.wait",)),
    ("idle thread-pool thread", ("WorkerThread.run (anyio",), ("Condition.wait", "get (queue")),
    ("waiting on PostgreSQL", ("(psycopg",), ("wait", "_exec_command", "_execute_send")),
    ("waiting on Redis", ("(redis",), ("_read_from_socket", "send_packed_command")),
    ("event loop (uvloop: I/O in C, or idle)", ("Runner.run (asyncio",), ("Runner.run",)),
    # the dispatcher's mutex is acquired in C, so the waiting frame is publish itself
    ("waiting for the event dispatcher's mutex (task-sent)",
     ("EventDispatcher.publish (celery",), ("EventDispatcher.publish",)),
    ("running Python", ("",), ("",)),
)


def parse_collapsed(text: str) -> list[tuple[list[str], int]]:
    """py-spy's raw output: ``frame;frame;...;leaf count`` per line."""
    stacks = []
    for line in text.splitlines():
        frames, _, count = line.rpartition(" ")
        if frames and count.isdigit():
            stacks.append((frames.split(";"), int(count)))
    return stacks


def state_of(frames: list[str]) -> str:
    for state, anywhere, leaf in STATES:
        if any(a in f for f in frames for a in anywhere) and any(x in frames[-1] for x in leaf):
            return state
    return "running Python"


def per_submit(counts: Counter, accepted: int) -> dict[str, float]:
    """Samples -> milliseconds of thread time per accepted submit."""
    return {k: round(1000 * n / RATE / accepted, 2) for k, n in counts.most_common()}


def summarize(stacks: list[tuple[list[str], int]], accepted: int, top: int = 12) -> dict:
    parts, states, leaf = Counter(), Counter(), Counter()
    for frames, n in stacks:
        for part, needles in PARTS.items():
            if any(needle in frame for frame in frames for needle in needles):
                parts[part] += n
        states[state_of(frames)] += n
        leaf[frames[-1]] += n
    total = sum(n for _, n in stacks)
    return {"samples": total, "ms_per_submit": round(1000 * total / RATE / accepted, 2),
            "parts": {k: per_submit(parts, accepted).get(k, 0.0) for k in PARTS},
            "states": per_submit(states, accepted),
            "self": dict(list(per_submit(leaf, accepted).items())[:top])}


def render(title: str, summary: dict) -> list[str]:
    lines = [f"== {title}: {summary['samples']} samples, "
             f"{summary['ms_per_submit']} ms per accepted submit"]
    for heading in ("states", "parts", "self"):
        if heading == "states" and len(summary["states"]) <= 1:
            continue
        lines.append(f"-- by {heading} (ms per accepted submit):")
        lines += [f"  {ms:8.2f}  {name}" for name, ms in summary[heading].items()]
    return lines


def record(pid: int, out: Path, duration_s: float, mode: str) -> subprocess.Popen:
    exe = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if exe is None:
        raise RuntimeError("py-spy is not installed (pip install -e '.[dev,bench]')")
    argv = [exe, "record", "--pid", str(pid), "--duration", str(round(duration_s)),
            "--rate", str(RATE), "--nonblocking", "--nolineno", "--format", "raw",
            "-o", str(out), f"--{mode}"]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def one_pass(args, url: str, key: str, api, pg: str, redis_url: str, raw: Path,
             mode: str) -> dict:
    """Load the API while py-spy samples it in ``mode`` (gil: CPU; idle: every thread)."""
    warm_up(url, key, args.connections)
    with Counters(pg, redis_url, args.settle, api.proc.pid) as counted:
        spy = record(api.proc.pid, raw, seconds(args.duration), mode)
        load = subprocess.run(hey_argv(url, key, SPEECH_BODY, connections=args.connections,
                                       duration=args.duration),
                              capture_output=True, text=True, check=True)
        _, err = spy.communicate(timeout=120)
    if not raw.exists():
        raise RuntimeError(f"py-spy wrote no profile:\n{err[-2000:]}")
    result = parse_hey_csv(load.stdout, args.connections)
    return {"load": {"accepted_per_s": round(result.accepted_per_s, 1),
                     "p50_ms": round(result.p50_ms, 1), "p99_ms": round(result.p99_ms, 1),
                     "statuses": result.statuses},
            "counters": counted.per(result.accepted),
            "summary": summarize(parse_collapsed(raw.read_text()), max(result.accepted, 1))}


def profile(args: argparse.Namespace, stem: Path) -> str:
    with ExitStack() as stack:
        work = workdir(stack)
        redis, sw, pg = start_redis(stack, work), seaweedfs(stack, work), database(stack)
        tree = Tree(label="this tree", path=ROOT)
        env = omnijobs_env(tree, pg, redis.db(0), sw, work)
        key = prepare(tree, env)
        api, base = start_api(tree, env, work)
        stack.callback(api.stop)
        lines = []
        for mode, title in (("gil", "CPU: the thread holding the GIL"),
                            ("idle", "every thread, busy or waiting")):
            raw = stem.with_name(f"{stem.name}-{mode}.collapsed.txt")
            found = one_pass(args, base + PATH, key, api, pg, redis.db(0), raw, mode)
            lines += [f"load ({mode} pass): {found['load']}",
                      f"per accepted submit: {found['counters']}",
                      *render(title, found["summary"]), ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_submit",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--duration", default="20s")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--settle", type=float, default=SETTLE_S)
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    args = parser.parse_args()
    args.results_dir.mkdir(parents=True, exist_ok=True)
    stem = args.results_dir / f"profile-submit-{datetime.now(UTC):%Y%m%dT%H%M%S}"
    text = profile(args, stem)
    stem.with_suffix(".summary.txt").write_text(text)
    print(text, end="")
    print(f"\nwritten: {stem}-gil.collapsed.txt, {stem}-idle.collapsed.txt, "
          f"{stem}.summary.txt")


if __name__ == "__main__":
    main()
