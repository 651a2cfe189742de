"""Workers break: killed mid-generation, or handed every message twice."""

from __future__ import annotations

import os
import signal

from celery import Celery

from storage.db import make_engine, make_sessionmaker
from storage.repositories import JobRepository

from ..services import wait_until
from .conftest import WORKER_PIPELINES, Chaos, settle, tally

ASYNC = {"Prefer": "respond-async"}


def submit(client, text: str, model: str = "test-fast") -> str:
    resp = client.post("/v1/audio/speech", headers=ASYNC, json={"model": model, "input": text})
    assert resp.status_code == 202, resp.text
    return resp.json()["id"]


def children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def test_sigkill_worker_mid_generation(chaos: Chaos):
    """20 jobs in flight (half a second of work each); the worker (supervisor and child)
    is killed while one of them is generating; a new worker finishes all 20."""
    victim = chaos.processes["worker-1"]  # stopped by the fixture if this test fails early
    with chaos.client(chaos.new_key("sigkill")) as c:
        ids = [submit(c, "0.5", model="test-sleep") for _ in range(20)]

        def mid_generation() -> bool:
            states = c.get("/v1/jobs", params={"limit": 100}).json()["data"]
            return (sum(j["status"] == "completed" for j in states) >= 2
                    and any(j["status"] == "running" for j in states))

        wait_until(mid_generation, 60, "jobs to be in the middle of generation")
        child = children(victim.proc.pid)
        for pid in [*child, victim.proc.pid]:
            os.kill(pid, signal.SIGKILL)
        victim.proc.wait(10)
        del chaos.processes["worker-1"]
        chaos.start_worker("worker-2")
        counts = tally(chaos, ids, settle(c, ids, 120), "sigkill_worker")
    assert counts.completed == 20 and counts.lost == 0 and counts.duplicated == 0


def test_every_message_delivered_twice_to_two_workers(chaos: Chaos):
    """A copy of every render message goes out right behind the original, with two
    workers consuming: each job is claimed once, completed once, stored once. The two are
    the fixture's running worker (worker-1, or worker-2 after the SIGKILL test) and
    worker-3, started here."""
    running = chaos.default_workers()[:1]
    names = ["worker-3"] if running else ["worker-2", "worker-3"]
    chaos.start_workers(*((name, WORKER_PIPELINES, None, {}) for name in names))
    consumers = {*running, *names}
    jobs = JobRepository(make_sessionmaker(make_engine(chaos.db_url)))
    sender = Celery(broker=chaos.redis.url)
    try:
        with chaos.client(chaos.new_key("twice")) as c:
            ids = []
            for i in range(20):
                job_id = submit(c, f"Twice {i}.")
                token = jobs.get(job_id).dispatch_token
                sender.send_task("omnijobs.render", args=[job_id, token],
                                 queue="pipeline.test-fast")
                ids.append(job_id)
            final = settle(c, ids, 120)
            counts = tally(chaos, ids, final, "double_delivery")
        assert counts.completed == 20 and counts.lost == 0 and counts.duplicated == 0
        assert all(final[i]["attempts"] == 1 for i in ids)

        def skipped() -> dict[str, int]:  # one of the two messages of each claimed nothing
            seen: dict[str, int] = {}
            for r in chaos.worker_records():
                if r.get("job_id") in ids and "claimed nothing" in r["message"]:
                    seen[r["job_id"]] = seen.get(r["job_id"], 0) + 1
            return seen

        wait_until(lambda: len(skipped()) == 20, 30, "every copy to be delivered")
        assert set(skipped().values()) == {1}
        handled_by = {name for name in consumers
                      if "claimed" in chaos.processes[name].log.read_text()}
        assert handled_by == consumers
    finally:
        sender.close()
        chaos.processes.pop("worker-3").stop()
