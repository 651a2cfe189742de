"""The cost-flat benchmark's in-process figures, for one source tree.

Run as a script (``python bench/costflat_probe.py``) with ``PYTHONPATH`` naming the tree
whose repositories are measured, so the same probe times today's code and another
commit's. It imports only what every tree has (the repositories and their public
calls), times each call against the empty and the loaded database alternately, and
prints one JSON object: per figure and database, every sample in milliseconds.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import time
import uuid

from core.jobs import JobKind
from storage.db import make_engine, make_sessionmaker
from storage.records import JobFilter, NewJob
from storage.repositories import JobRepository, QueueRepository, WorkerRepository
from storage.repositories.quotas import Quota, Quotas

PIPELINES = ["piper-joe", "minimax-h3", "audex-tts"]


class Side:
    """One database: its sessions and the repositories the figures call."""

    def __init__(self, url: str, info: dict) -> None:
        self.sessions = make_sessionmaker(make_engine(url, pool_size=2))
        self.jobs = JobRepository(self.sessions)
        self.queues = QueueRepository(self.sessions)
        self.workers = WorkerRepository(self.sessions)
        self.info = info
        self.claimable = list(info["claimable"])
        self.tokens = list(info["tokens"])  # of the jobs the fair claims wake their lane by
        self.quotas = Quotas({"interactive": Quota(1000, 10_000)})  # the default caps

    def figures(self) -> dict:
        tenant, cursor = self.info["tenant"], self.info["cursor_page_100"]
        new = NewJob(tenant_id=tenant, kind=JobKind.SPEECH, model="tts-1",
                     pipeline="piper-joe", queue="render.piper-joe",
                     request={"input": "hello"}, metadata=None, max_attempts=3)
        return {
            "list_page_1_sql": lambda: self.jobs.find(JobFilter(tenant), limit=100),
            "list_page_100_sql": lambda: self.jobs.find(JobFilter(tenant), after=cursor,
                                                        limit=100),
            # a day's lease: the claimed jobs never become the reaper's
            "claim": lambda: self.jobs.claim(self.claimable.pop(), "bench-" + uuid.uuid4().hex,
                                             86400.0),
            # (a tree from before the fair share has no such claim)
            **({"fair_claim": self._fair_claim} if hasattr(self.jobs, "claim_next") else {}),
            "lease_reaper": lambda: self.jobs.expired_leases(),
            "retention_outputs_to_expire": lambda: self.jobs.outputs_to_expire(),
            "retention_finished_before": lambda: self.jobs.finished_before(30 * 86400.0),
            # the cutoff as of the load: the backlog (minutes old then) is not stale yet
            "stale_queued": lambda: self.jobs.stale_queued(
                900.0 + time.time() - self.info["loaded_at"]),
            "submit_quota_count": lambda: self._quota(new),
            # what one group pays with an API process's memory of its last counts
            **({"submit_quota_check": lambda: self._quota(new, self.quotas)}
               if "read" in inspect.signature(Quotas.admit_many).parameters else {}),
            "metrics_scrape": lambda: self.workers.serving(
                list(self.queues.signals(PIPELINES, 60.0).running)),
        }

    def _fair_claim(self) -> None:
        """What a render message does (``claim_next``): its token wakes the lane of the
        job holding it, and the fairest ready job there is claimed. A claim that takes
        another job hands the holder that job's token, which the next claim uses."""
        token = self.tokens.pop()
        job = self.jobs.claim_next(token, "bench-" + uuid.uuid4().hex, 86400.0)
        if job is not None and job.dispatch_token != token:
            self.tokens.append(job.dispatch_token)

    def _quota(self, new: NewJob, quotas: Quotas | None = None) -> None:
        """The submit's counts as a group that has to read them (new quotas: nothing
        remembered from the last call), for the trees before and after they were read
        outside the insert's transaction; with ``quotas``, as a group of a process that
        remembers what it counted last (``submit_quota_check``)."""
        quotas = quotas or Quotas({"interactive": Quota(1000, 10_000)})
        if "read" not in inspect.signature(Quotas.admit_many).parameters:
            with self.sessions() as s:  # in a transaction rolled back
                quotas.admit_many(s, [new])
                s.rollback()
            return
        engine = self.sessions.kw["bind"]

        def read(statement, params):
            with engine.connect() as conn:
                return conn.execute(statement, params).one()
        quotas.admit_many(read, [new])


def timed(call) -> float:
    t0 = time.perf_counter()
    call()
    return (time.perf_counter() - t0) * 1000


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--setup", required=True, help="JSON: per side its url and info")
    p.add_argument("--samples", type=int, default=100)
    p.add_argument("--claims", type=int, default=100)
    p.add_argument("--only", default="", help="comma-separated figure names")
    p.add_argument("--budget-s", type=float, default=40.0,
                   help="per figure: stop sampling after this long (at least 10 samples)")
    args = p.parse_args()
    setup = json.loads(args.setup)
    sides = {name: Side(s["url"], s["info"]) for name, s in setup.items()}
    figures = {name: side.figures() for name, side in sides.items()}
    wanted = [f for f in figures["empty"] if not args.only or f in args.only.split(",")]
    out: dict[str, dict[str, list[float]]] = {}
    gc.disable()  # the collector's pauses are the process's, not the database's
    for figure in wanted:
        n = args.claims if figure in ("claim", "fair_claim") else args.samples
        for name in sides:  # warm-up: plans cached, pages in memory
            for _ in range(min(3, n)):
                figures[name][figure]()
        samples: dict[str, list[float]] = {name: [] for name in sides}
        began = time.monotonic()
        for i in range(n):
            if i >= 10 and time.monotonic() - began > args.budget_s:
                break  # a slow figure on a busy machine: enough samples for its p50
            order = list(sides) if i % 2 == 0 else list(sides)[::-1]
            for name in order:
                samples[name].append(timed(figures[name][figure]))
        out[figure] = samples
        gc.collect()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
