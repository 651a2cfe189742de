"""Scale-in while jobs run: workers stopped one by one (SIGTERM), one with a drain too
short for its job (it hands the job back), one with enough (it finishes). Every job
completes exactly once; none is lost."""

from __future__ import annotations

import signal

from sqlalchemy import text

from storage.db import make_engine

from ..services import wait_until
from .conftest import Chaos, settle, tally
from .test_workers import children, submit


def running_on(chaos: Chaos, worker) -> int:
    """Jobs the worker's render process (the supervisor's child) holds right now."""
    [pid] = children(worker.proc.pid)
    engine = make_engine(chaos.db_url)
    try:
        with engine.connect() as conn:
            return conn.execute(text("SELECT count(*) FROM jobs WHERE status = 'running' "
                                     "AND worker_id LIKE :w"), {"w": f"%:{pid}"}).scalar()
    finally:
        engine.dispose()


def test_workers_stopped_one_by_one_lose_and_repeat_nothing(chaos: Chaos):
    # Named worker-*: the tally reads every worker-*.log for completions.
    short = chaos.start_worker("worker-scale-in-short", OMNIJOBS_DRAIN_S="0.2")
    full = chaos.start_worker("worker-scale-in-full")
    last = chaos.start_worker("worker-scale-in-last")
    with chaos.client(chaos.new_key("scale-in")) as c:
        ids = [submit(c, "3", model="test-sleep") for _ in range(30)]

        def states() -> list[str]:
            return [c.get(f"/v1/jobs/{i}").json()["status"] for i in ids]

        for victim, after in ((short, 3), (full, 10)):
            wait_until(lambda n=after, v=victim: states().count("completed") >= n
                       and running_on(chaos, v), 120, f"{victim.name} to be running a job")
            victim.proc.send_signal(signal.SIGTERM)
            assert victim.proc.wait(60) == 0, victim.tail()
            del chaos.processes[victim.name]
        counts = tally(chaos, ids, settle(c, ids, 180), "scale_in")
    handed = [r for r in chaos.worker_records() if r.get("job_id") in ids
              and r["message"].endswith("handed back (the worker is stopping)")]
    print(f"scale_in: handed_back={len(handed)}")
    chaos.processes.pop(last.name).stop()
    assert counts.completed == 30 and counts.lost == 0 and counts.duplicated == 0
    assert counts.failed == 0
    assert {r["job_id"] for r in handed} <= set(ids) and handed, \
        "the short drain handed no job back"
