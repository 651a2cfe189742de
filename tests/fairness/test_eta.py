"""Queue position and estimates against a real drain: a queue of two tenants' jobs
emptied by two workers, each job's estimate (read while it waited) compared with the
time it really started; and the ``queue`` events of its event stream."""

from __future__ import annotations

import json
import statistics
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx

from .conftest import PACED, FairStack, submit_many, wait_done

WORKERS = 2
# Timestamps are whole seconds; a drain of this queue takes about 20 s.
TOLERANCE_P50_S = 2.0


def started_at(st: FairStack, job_ids: list[str]) -> dict[str, float]:
    return {j: t.timestamp() for j, t in st.rows(
        "SELECT id, started_at FROM jobs WHERE id = ANY(:ids)", ids=job_ids)}


def test_with_no_live_worker_the_estimate_is_a_reason_not_a_guess(fair: FairStack):
    key = fair.new_key("eta-none")
    [job_id] = submit_many(fair, key, PACED, 1)
    with fair.client(key) as c:
        job = c.get(f"/v1/jobs/{job_id}").json()
    assert job["status"] == "queued" and job["queue_position"] == 0
    assert job["estimated_start_at"] is None and job["estimated_completed_at"] is None
    assert job["estimate_unavailable_reason"] == "no_live_worker"


def queue_events(st: FairStack, key: str, job_id: str, seen: list[dict],
                 done: threading.Event) -> None:
    with httpx.stream("GET", f"{st.base_url}/v1/jobs/{job_id}/events", timeout=60,
                      headers={"Authorization": f"Bearer {key}"}) as resp:
        event = None
        for line in resp.iter_lines():
            if line.startswith("event: "):
                event = line.removeprefix("event: ")
            elif line.startswith("data: ") and event == "queue":
                seen.append(json.loads(line.removeprefix("data: ")))
            if done.is_set() or (line.startswith("data: ") and event == "status"
                                 and json.loads(line[6:])["status"] == "running"):
                return


def read_estimates(st: FairStack, key: str, job_ids: list[str]) -> dict[str, tuple[int, int]]:
    """(estimated start, position) of each job still queued, read eight at a time."""
    with st.client(key) as c, ThreadPoolExecutor(8) as pool:
        jobs = list(pool.map(lambda j: c.get(f"/v1/jobs/{j}").json(), job_ids))
    for job in jobs:
        if job["status"] == "queued":
            assert job["estimate_unavailable_reason"] is None, job
            assert job["estimated_completed_at"] >= job["estimated_start_at"]
    return {j["id"]: (j["estimated_start_at"], j["queue_position"]) for j in jobs
            if j["status"] == "queued"}


def test_estimates_match_the_real_drain(fair: FairStack):
    x, y = fair.new_key("eta-x"), fair.new_key("eta-y")
    fair.start_workers(PACED, *(f"eta-{i}" for i in range(WORKERS)))
    wait_done(fair, submit_many(fair, x, PACED, 12, "warm-up"))  # the pace, measured
    xs = submit_many(fair, x, PACED, 40, "x")
    ys = submit_many(fair, y, PACED, 20, "y")
    last = ys[-1]
    seen: list[dict] = []
    done = threading.Event()
    stream = threading.Thread(target=queue_events, args=(fair, y, last, seen, done))
    stream.start()
    estimates = read_estimates(fair, x, xs) | read_estimates(fair, y, ys)
    wait_done(fair, xs + ys)
    done.set()
    stream.join(60)
    real = started_at(fair, list(estimates))
    errors = sorted(abs(est - real[j]) for j, (est, _) in estimates.items())
    p50 = statistics.median(errors)
    print(f"eta_error_p50_s={p50:.2f} eta_error_max_s={errors[-1]:.2f} "
          f"estimated_jobs={len(errors)}")
    assert len(errors) >= 40  # most of the 60 were still waiting when read
    assert p50 <= TOLERANCE_P50_S
    # Fair share shows in the positions: y's last job is not behind every x job waiting.
    waiting_x, waiting_y = [j for j in xs if j in estimates], [j for j in ys if j in estimates]
    assert waiting_y and estimates[waiting_y[-1]][1] < len(waiting_x) + len(waiting_y) - 1
    # The stream's queue events: the position falls as the queue drains.
    positions = [e["queue_position"] for e in seen]
    assert len(positions) >= 2 and positions[0] > positions[-1] >= 0, positions
