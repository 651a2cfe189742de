"""Fast paths: the submit path, synchronous speech and the worker's own overhead,
each measured side by side with its baseline in one run.

    python -m bench.fastpaths [--duration 20s] [--connections 64] [--api-workers 1,2]
        [--sync-requests 20] [--worker-jobs 20] [--batch-lines 50000] [--ref GITREF]
    python -m bench.fastpaths --compose http://127.0.0.1:8000 --key KEY

Starts its own services (a fresh PostgreSQL database, redis-server, SeaweedFS, the
omnijobs API and worker, the bare baseline endpoint) and takes them down afterwards.
With ``--ref`` the omnijobs side also runs from another commit, in the same run. With
``--compose`` only the submit path is loaded, against a deployment that is already up.
Prints a markdown table and writes it, with every number behind it as JSON, to
``bench/results/``. See bench/README.md.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from . import batch_figure, submit, sync_speech, worker_overhead
from .counters import SETTLE_S
from .load import LoadResult, median_of, seconds
from .report import Figure, write
from .services import (
    ROOT,
    Process,
    Redis,
    Tree,
    Unsupported,
    checkout,
    database,
    git_commit,
    omnijobs_env,
    prepare,
    seaweedfs,
    start_api,
    start_bare,
    start_maintenance,
    start_redis,
    start_worker,
    workdir,
)

RESULTS = ROOT / "bench" / "results"
BARE_REDIS_DB = 15


@dataclass
class Side:
    """One tree's omnijobs: its own database, Redis database and API."""

    tree: Tree
    env: dict[str, str]
    key: str
    database_url: str
    redis_url: str
    home: Path
    base_url: str = ""
    pid: int | None = None
    api: Process | None = None
    figures: list[Figure] = field(default_factory=list)


def make_side(stack: ExitStack, tree: Tree, index: int, redis: Redis, sw, work: Path) -> Side:
    home = work / f"home-{index}"
    home.mkdir()
    pg, broker = database(stack), redis.db(index)
    env = omnijobs_env(tree, pg, broker, sw, home)
    return Side(tree=tree, env=env, key=prepare(tree, env), database_url=pg,
                redis_url=broker, home=home)


def renders(args: argparse.Namespace) -> bool:
    return bool(args.sync_requests or args.worker_jobs)


def measure_render(side: Side, args: argparse.Namespace, worker: Process | None = None) -> None:
    """Synchronous speech and worker overhead, with one worker serving both pipelines
    (a count of 0 leaves its figure out); ``worker``: that worker, if started already."""
    if not renders(args):
        return
    if worker is None:
        worker = start_worker(side.tree, side.env, side.home)
    try:
        if args.sync_requests:
            side.figures.append(sync_speech.figure(
                sync_speech.measure(side.base_url, side.key, args.sync_requests)))
        if args.worker_jobs:
            side.figures.append(worker_overhead.figure(worker_overhead.measure(
                side.base_url, side.key, side.database_url, args.worker_jobs, side.env)))
    finally:
        worker.stop()


@dataclass
class Bare:
    base_url: str
    pid: int
    database_url: str
    redis_url: str


def measure_submit(sides: list[Side], bare: Bare, args: argparse.Namespace) -> LoadResult:
    """``--submit-rounds`` rounds of every side at N connections and the bare endpoint,
    the bare one last in even rounds and first in odd ones (the machine's drift falls on
    both), each figure the medians of its rounds; the counters from the first round. Then
    every side at one connection."""
    runs: dict[int, list[LoadResult]] = {id(side): [] for side in sides}
    bare_runs: list[LoadResult] = []
    for r in range(args.submit_rounds):
        counted = {"settle_s": args.settle} if r == 0 else {}
        order = [*sides, None] if r % 2 == 0 else [None, *sides]
        for side in order:
            if side is None:
                bare_runs.append(submit.load(
                    bare.base_url, None, connections=args.connections,
                    duration=args.duration, **(dict(database_url=bare.database_url,
                                                    redis_url=bare.redis_url, pid=bare.pid,
                                                    **counted) if counted else {})))
                continue
            runs[id(side)].append(submit.load(
                side.base_url, side.key, connections=args.connections,
                duration=args.duration, **(dict(database_url=side.database_url,
                                                redis_url=side.redis_url, pid=side.pid,
                                                **counted) if counted else {})))
    baseline = median_of(bare_runs)
    for side in sides:
        single = submit.load(side.base_url, side.key, connections=1, duration=args.duration)
        side.figures[:0] = [submit.bare_figure(baseline),
                            submit.submit_figure(median_of(runs[id(side)]), baseline),
                            submit.single_figure(single)]
    return baseline


def measure_api_workers(sides: list[Side], bare: LoadResult, args: argparse.Namespace) -> None:
    for workers in args.api_workers:
        for side in sides:
            try:
                process, base = start_api(side.tree, side.env, side.home, workers=workers,
                                          name=f"api-workers-{workers}")
            except Unsupported:
                side.figures.append(submit.workers_figure(
                    workers, args.connections, None, bare, "not supported by this build"))
                continue
            try:
                result = submit.load(base, side.key, connections=args.connections,
                                     duration=args.duration)
            finally:
                process.stop()
            side.figures.append(submit.workers_figure(workers, args.connections, result, bare))


def measure_batches(sides: list[Side], args: argparse.Namespace) -> None:
    """Per tree: its API and a maintenance process (the batch step), one batch."""
    for side in sides:
        api, base, maintenance = start_api_and_maintenance(side)
        try:
            side.figures.append(batch_figure.figure(batch_figure.measure(
                base, side.key, side.redis_url, args.batch_lines), args.batch_lines))
        finally:
            maintenance.stop()
            api.stop()


def start_api_and_maintenance(side: Side) -> tuple[Process, str, Process]:
    """Both started at once (neither needs the other to start; the batch is sent once
    both are ready); if either fails to start, the other is stopped."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        starting = pool.submit(start_maintenance, side.tree, side.env, side.home)
        try:
            api, base = start_api(side.tree, side.env, side.home, name="api-batch")
        except BaseException:
            with suppress(Exception):
                starting.result().stop()
            raise
        try:
            maintenance = starting.result()
        except BaseException:
            api.stop()
            raise
    return api, base, maintenance


def start_sides(stack: ExitStack, args: argparse.Namespace, work: Path,
                made: Callable[[list[Side]], None] | None = None) -> list[Side]:
    """Shared Redis and SeaweedFS; per tree a database, a Redis database and an API
    (``made`` is called with the sides once their databases are ready, before the APIs
    start)."""
    redis = start_redis(stack, work)
    sw = seaweedfs(stack, work)
    trees = [Tree(label=f"this tree, {git_commit(ROOT)}", path=ROOT)]
    if args.ref:
        (work / "checkout").mkdir()
        trees.insert(0, stack.enter_context(checkout(args.ref, work / "checkout")))
    sides = [make_side(stack, tree, i, redis, sw, work) for i, tree in enumerate(trees)]
    if made is not None:
        made(sides)
    for side in sides:
        process, side.base_url = start_api(side.tree, side.env, side.home)
        side.pid = process.proc.pid
        side.api = process
        stack.callback(process.stop)
    return sides


def start_baseline(stack: ExitStack, side: Side, work: Path) -> Bare:
    """The bare endpoint, on this tree's database and a Redis database of its own."""
    redis_url = side.redis_url.rsplit("/", 1)[0] + f"/{BARE_REDIS_DB}"
    process, base = start_bare(side.database_url, redis_url, work, stack)
    return Bare(base, process.proc.pid, side.database_url, redis_url)


def run_local(args: argparse.Namespace) -> dict[str, list[Figure]]:
    with ExitStack() as stack:
        work = workdir(stack)
        # The first side's render worker starts while the APIs and the bare endpoint do:
        # it needs only the migrated database, takes no port, and idles until its figures.
        pool = stack.enter_context(ThreadPoolExecutor(max_workers=1))
        starting: list[Future[Process]] = []
        stack.callback(stop_started, starting)

        def start_first_worker(sides: list[Side]) -> None:
            if renders(args):
                first = sides[0]
                starting.append(pool.submit(start_worker, first.tree, first.env, first.home))

        sides = start_sides(stack, args, work, start_first_worker)
        bare = start_baseline(stack, sides[-1], work)
        for i, side in enumerate(sides):
            measure_render(side, args, starting[0].result() if i == 0 and starting else None)
        baseline = measure_submit(sides, bare, args)
        for side in sides:  # out of the way of the --workers runs
            side.api.stop()
        measure_api_workers(sides, baseline, args)
        if args.batch_lines:
            measure_batches(sides, args)
        return {side.tree.label: side.figures for side in sides}


def stop_started(starting: list[Future[Process]]) -> None:
    """Stops what was started ahead, once its start is over (a no-op if stopped)."""
    for future in starting:
        with suppress(Exception):
            future.result().stop()


def run_compose(args: argparse.Namespace) -> dict[str, list[Figure]]:
    base = args.compose.rstrip("/")
    result = submit.load(base, args.key, connections=args.connections, duration=args.duration)
    single = submit.load(base, args.key, connections=1, duration=args.duration)
    return {f"compose, {base}": [submit.submit_figure(result, None, "the deployment"),
                                 submit.single_figure(single)]}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.fastpaths",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--duration", default="20s", help="hey -z per load run (20s)")
    parser.add_argument("--connections", type=int, default=64, help="hey -c (64)")
    parser.add_argument("--submit-rounds", type=int, default=3,
                        help="alternating rounds of the submit loads (3; figures: medians)")
    parser.add_argument("--api-workers", default="",
                        help="also load `omnijobs api --workers N` for each N, e.g. 1,2")
    parser.add_argument("--sync-requests", type=int, default=20, help="20; 0: no figure")
    parser.add_argument("--worker-jobs", type=int, default=20, help="20; 0: no figure")
    parser.add_argument("--batch-lines", type=int, default=batch_figure.BATCH_LINES,
                        help="lines of the batch file (50000; 0: no figure)")
    parser.add_argument("--ref", help="also run the omnijobs side from this git ref")
    parser.add_argument("--compose", metavar="URL", help="load this running deployment only")
    parser.add_argument("--key", help="API key for --compose")
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    parser.add_argument("--settle", type=float, default=SETTLE_S,
                        help="seconds to wait before reading PostgreSQL's counters (11: "
                             "exact; less: approximate)")
    args = parser.parse_args(argv)
    seconds(args.duration)  # validates the syntax before anything starts
    if args.compose and not args.key:
        parser.error("--compose needs --key")
    args.api_workers = [int(n) for n in args.api_workers.split(",") if n.strip()]
    return args


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: stop and drop all
    started = datetime.now(UTC)
    sides = run_compose(args) if args.compose else run_local(args)
    meta = {"date": started.strftime("%Y-%m-%d %H:%M UTC"),
            "command": "python -m bench.fastpaths " + " ".join(argv or sys.argv[1:]),
            "cpus": os.cpu_count(), "commit": git_commit(ROOT), "ref": args.ref}
    md, js = write(args.results_dir / f"fastpaths-{started:%Y%m%dT%H%M%S}", meta, sides)
    print(md.read_text(), end="")
    print(f"\n{meta['date']}, {meta['cpus']} CPUs; written to {md} and {js}")
    return js


if __name__ == "__main__":
    main()
