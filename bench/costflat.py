"""Do the service's reads cost the same when its tables hold a month of use?

``python -m bench.costflat [--scale 1] [--ref GITREF]``: two databases on the test
PostgreSQL server, both with the same working set (bench/costflat_load.py), one of them
also with a million finished jobs (outputs, attempts, outbox rows, webhook events and
deliveries) across 1,000 tenants and 100,000 queued. Each figure is timed on both,
alternately, and reported as loaded/empty. With ``--ref``, the same figures first for
that commit's code on that commit's schema (this tree's later migrations downgraded),
then for this tree: before and after in one run, on one load.

The HTTP figures go through an ``omnijobs api`` per database (production mode, its own
Redis and SeaweedFS); the others call the repositories in-process
(bench/costflat_probe.py, run under the measured tree).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path

import httpx
import psycopg
from alembic.config import Config
from alembic.script import ScriptDirectory

from storage.db import make_engine, make_sessionmaker
from storage.migrate import downgrade, upgrade
from storage.repositories.keys import KeyRepository
from tests.services import ROOT

from . import services as svc
from .costflat_load import CLAIMABLE, load


def p(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def head_of(tree: Path) -> str:
    """The newest migration of a source tree (of its own ``migrations/``)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(tree / "migrations"))
    return ScriptDirectory.from_config(cfg).get_current_head()


def prepare(url: str, scale: float | None, idle_tenants: int = 0) -> dict:
    """Migrated, keyed and loaded; what the reads need to know about it."""
    upgrade(url)
    tenant, key = KeyRepository(make_sessionmaker(make_engine(url))).create_key("bench")
    t0, loaded_at = time.monotonic(), time.time()
    load(url, tenant, scale, idle_tenants)
    with psycopg.connect(url) as conn:
        cursor = conn.execute(
            "SELECT id FROM jobs WHERE tenant_id = %s ORDER BY created_at DESC, id DESC "
            "OFFSET 9899 LIMIT 1", (tenant,)).fetchone()[0]
        one = conn.execute("SELECT id FROM jobs WHERE tenant_id = %s ORDER BY id LIMIT 1",
                           (tenant,)).fetchone()[0]
        claimable = [r[0] for r in conn.execute(
            "SELECT id FROM jobs WHERE metadata->>'set' = 'wq' ORDER BY id")]
        tokens = [r[0] for r in conn.execute(
            "SELECT dispatch_token FROM jobs WHERE metadata->>'set' = 'wf' ORDER BY id")]
        size = conn.execute("SELECT pg_size_pretty(pg_database_size(current_database()))"
                            ).fetchone()[0]
    return {"tenant": tenant, "key": key, "loaded_at": loaded_at, "cursor_page_100": cursor,
            "job_id": one, "claimable": claimable, "tokens": tokens, "size": size,
            "load_s": round(time.monotonic() - t0, 1)}


def start_api(tree: svc.Tree, env: dict, home: Path, name: str) -> tuple[svc.Process, str]:
    """``omnijobs api`` on a free port, given the time a busy machine may need."""
    port = svc.free_port()
    process = svc.spawn(name, [sys.executable, "-m", "omnijobs.cli", "api", "--port",
                               str(port)], env, tree.path, home)
    base = f"http://127.0.0.1:{port}"
    svc.wait_ready(process, svc.http_ok(f"{base}/readyz"), 600)
    return process, base


def http_figures(bases: dict[str, str], infos: dict[str, dict], n: int) -> dict:
    clients = {name: httpx.Client(base_url=base, timeout=60, headers={
        "Authorization": f"Bearer {infos[name]['key']}"}) for name, base in bases.items()}
    paths = {"list_page_1": lambda i: "/v1/jobs?limit=100",
             "list_page_100": lambda i: f"/v1/jobs?limit=100&after={i['cursor_page_100']}",
             "get_job": lambda i: f"/v1/jobs/{i['job_id']}"}
    out = {}
    for figure, path in paths.items():
        samples: dict[str, list[float]] = {name: [] for name in bases}
        for i in range(n + 3):
            order = list(bases) if i % 2 == 0 else list(bases)[::-1]
            for name in order:
                t0 = time.perf_counter()
                r = clients[name].get(path(infos[name]))
                ms = (time.perf_counter() - t0) * 1000
                r.raise_for_status()
                if i >= 3:  # warm-up
                    samples[name].append(ms)
        out[figure] = samples
    for c in clients.values():
        c.close()
    return out


def run_phase(tree: svc.Tree, urls: dict[str, str], infos: dict[str, dict], claims: slice,
              args, redis: svc.Redis, sw, home: Path) -> dict:
    """Every figure for one tree, empty and loaded side by side."""
    figures: dict = {}
    if args.http_samples:
        procs, bases = [], {}
        for i, (name, url) in enumerate(urls.items()):
            env = svc.omnijobs_env(tree, url, redis.db(i + 1), sw, home / name)
            (home / name).mkdir(exist_ok=True)
            procs.append(start_api(tree, env, home, f"api-{name}"))
            bases[name] = procs[-1][1]
        try:
            figures.update(http_figures(bases, infos, args.http_samples))
        finally:
            for proc, _ in procs:
                proc.stop()
    setup = {name: {"url": url, "info": {**infos[name],
                                         "claimable": infos[name]["claimable"][claims],
                                         "tokens": infos[name]["tokens"][claims]}}
             for name, url in urls.items()}
    env = {**os.environ, "PYTHONPATH": str(tree.path)}
    out = subprocess.run([sys.executable, "-P", str(ROOT / "bench" / "costflat_probe.py"),
                          "--setup", json.dumps(setup), "--samples", str(args.samples),
                          "--claims", str(args.claims)], env=env, cwd=tree.path,
                         capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"probe failed:\n{out.stderr[-3000:]}")
    figures.update(json.loads(out.stdout))
    return figures


def summary(figures: dict) -> dict:
    rows = {}
    for figure, sides in figures.items():
        e, l_ = sides["empty"], sides["loaded"]
        rows[figure] = {"empty_p50": p(e, .5), "empty_p99": p(e, .99),
                        "loaded_p50": p(l_, .5), "loaded_p99": p(l_, .99),
                        "ratio_p50": p(l_, .5) / p(e, .5), "ratio_p99": p(l_, .99) / p(e, .99),
                        "n": len(e)}
    return rows


def table(phases: dict[str, dict]) -> str:
    labels = list(phases)
    head = "| figure | " + " | ".join(
        f"{label}: empty p50/p99 ms | {label}: loaded p50/p99 ms | {label}: loaded/empty "
        "p50 (p99)" for label in labels) + " |"
    lines = [head, "|" + "---|" * (1 + 3 * len(labels))]
    for figure in phases[labels[-1]]:
        cells = []
        for label in labels:
            r = phases[label].get(figure)
            if r is None:
                cells += ["-", "-", "-"]
                continue
            cells += [f"{r['empty_p50']:.2f} / {r['empty_p99']:.2f}",
                      f"{r['loaded_p50']:.2f} / {r['loaded_p99']:.2f}",
                      f"{r['ratio_p50']:.2f}x ({r['ratio_p99']:.2f}x)"]
        lines.append(f"| {figure} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=float, default=1.0,
                    help="history size: 1 = 1,000,000 finished + 100,000 queued jobs")
    ap.add_argument("--ref", help="also measure this commit's code on its own schema")
    ap.add_argument("--samples", type=int, default=100, help="per in-process figure")
    ap.add_argument("--http-samples", type=int, default=100, help="per HTTP figure; 0: none")
    ap.add_argument("--claims", type=int, default=100)
    ap.add_argument("--idle-tenants", type=int, default=0,
                    help="the loaded database also holds this many tenants that never "
                         "submitted anything")
    ap.add_argument("--results-dir", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # clean up as on Ctrl-C
    phases_n = 2 if args.ref else 1
    if phases_n * (args.claims + 3) > CLAIMABLE:
        ap.error(f"at most {CLAIMABLE // phases_n - 3} claims per phase")
    args.results_dir.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        home = Path(tempfile.mkdtemp(prefix="omnijobs-costflat-"))
        stack.callback(shutil.rmtree, home, ignore_errors=True)
        urls = {"empty": svc.database(stack), "loaded": svc.database(stack)}
        infos = {"empty": prepare(urls["empty"], None),
                 "loaded": prepare(urls["loaded"], args.scale, args.idle_tenants)}
        print(f"loaded: {infos['loaded']['load_s']} s, {infos['loaded']['size']} "
              f"(empty: {infos['empty']['size']})", flush=True)
        redis, sw = svc.start_redis(stack, home), svc.seaweedfs(stack, home)
        this = svc.Tree(label=f"this tree ({svc.git_commit(ROOT)})", path=ROOT)
        phases: dict[str, dict] = {}
        per = args.claims + 3
        if args.ref:
            tree = stack.enter_context(svc.checkout(args.ref, home))
            for url in urls.values():  # that commit's schema: this tree's later steps undone
                downgrade(url, head_of(tree.path))
            phases[f"before ({tree.label})"] = summary(run_phase(
                tree, urls, infos, slice(0, per), args, redis, sw, home))
            for url in urls.values():
                upgrade(url)
        phases[f"after ({this.label})"] = summary(run_phase(
            this, urls, infos, slice(CLAIMABLE - per, CLAIMABLE), args, redis, sw, home))
    text = table(phases)
    print(text)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    base = args.results_dir / f"costflat-{stamp}"
    base.with_suffix(".md").write_text(text + "\n")
    base.with_suffix(".json").write_text(json.dumps(
        {"args": {k: str(v) for k, v in vars(args).items()}, "phases": phases,
         "load": {k: {"load_s": v["load_s"], "size": v["size"]} for k, v in infos.items()}},
        indent=1))


if __name__ == "__main__":
    main()
