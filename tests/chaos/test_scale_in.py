"""Scale-in while jobs run: workers stopped one by one (SIGTERM), one with a drain too
short for its job (it hands the job back), one with enough (it finishes). Every job
completes exactly once; none is lost."""

from __future__ import annotations

import signal

from sqlalchemy import text

from storage.db import make_engine

from ..services import wait_until
from .conftest import Chaos, settle, stop_together, tally
from .test_workers import children, submit

JOB_S = 3.0  # each job's work
# A victim is stopped right after it claims a job (its log says so), and only while that
# job was claimed less than FRESH_S ago (the database says so): the job has at least
# JOB_S - FRESH_S of work left when SIGTERM arrives, far more than the short drain (0.2 s).
FRESH_S = 2.0
# Three workers take the first three jobs; the short one is stopped on its second claim,
# the full one on its next claim after that, with jobs still queued for it then.
JOBS = 8


def running_on(chaos: Chaos, worker, claimed_within_s: float) -> int:
    """Jobs the worker's render process (the supervisor's child) holds right now, on an
    attempt it claimed within the last ``claimed_within_s``."""
    [pid] = children(worker.proc.pid)
    engine = make_engine(chaos.db_url)
    try:
        with engine.connect() as conn:
            return conn.execute(text(
                "SELECT count(*) FROM jobs j JOIN job_attempts a "
                "ON a.job_id = j.id AND a.attempt = j.attempts "
                "WHERE j.status = 'running' AND j.worker_id LIKE :w "
                "AND a.claimed_at > clock_timestamp() - make_interval(secs => :fresh)"),
                {"w": f"%:{pid}", "fresh": claimed_within_s}).scalar()
    finally:
        engine.dispose()


def claims(worker) -> int:
    """Jobs the worker has claimed so far (its log's claim lines)."""
    return worker.log.read_text().count(" claimed (attempt ")


def stop_on_claim(chaos: Chaos, victim, after: int) -> None:
    """SIGTERM the worker once it holds a job it claimed after its first ``after``, and
    wait for it to exit."""
    wait_until(lambda: claims(victim) > after and running_on(chaos, victim, FRESH_S), 120,
               f"{victim.name} to be running a job")
    victim.proc.send_signal(signal.SIGTERM)
    assert victim.proc.wait(60) == 0, victim.tail()
    del chaos.processes[victim.name]


def test_workers_stopped_one_by_one_lose_and_repeat_nothing(chaos: Chaos):
    # Named worker-*: the tally reads every worker-*.log for completions. The fixture's
    # own worker (worker-1, or worker-2 after test_workers) is the one left running.
    served = ("test-fast", "test-sleep")
    names = ["worker-scale-in-short", "worker-scale-in-full",
             *([] if chaos.default_workers() else ["worker-scale-in-last"])]
    try:
        short, full, *_ = chaos.start_workers(
            *((name, served, None, {"OMNIJOBS_DRAIN_S": "0.2"} if "short" in name else {})
              for name in names))
        with chaos.client(chaos.new_key("scale-in")) as c:
            ids = [submit(c, f"{JOB_S:g}", model="test-sleep") for _ in range(JOBS)]
            stop_on_claim(chaos, short, after=1)  # it rendered one job and took the next
            stop_on_claim(chaos, full, after=claims(full))  # its next job after short's
            counts = tally(chaos, ids, settle(c, ids, 180), "scale_in")
        handed = [r for r in chaos.worker_records() if r.get("job_id") in ids
                  and r["message"].endswith("handed back (the worker is stopping)")]
        print(f"scale_in: handed_back={len(handed)}")
    finally:  # none of them may go on taking the other tests' jobs
        stop_together([chaos.processes.pop(n) for n in names if n in chaos.processes])
    assert counts.completed == JOBS and counts.lost == 0 and counts.duplicated == 0
    assert counts.failed == 0
    assert {r["job_id"] for r in handed} <= set(ids) and handed, \
        "the short drain handed no job back"
