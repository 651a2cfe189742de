"""Services stall instead of failing: Redis is frozen (SIGSTOP: connections are accepted,
nothing is answered), the database stops answering behind a proxy. Requests are answered
within their bounds (the counts line adds ``max_answer_s``, the longest any request waited
during the stall), and nothing accepted is lost or done twice."""

from __future__ import annotations

import threading
import time
from urllib.parse import urlsplit

import httpx

from ..proxy import Proxy, through
from ..services import free_port, spawn, stop_all, wait_until
from .conftest import ASYNC, Chaos, Load, settle, tally, until

# Each outage lasts until what it is meant to cause has been seen (each test says what),
# and at most this long; the assertions after it then say what was not.
MAX_STALL_S = 30.0
ANSWER_DEADLINE_S = 30.0  # a request not answered by then is hung (the bounds are seconds)
# Requests answered during an outage, at least: submits while Redis is frozen (each
# waits out OMNIJOBS_REDIS_TIMEOUT_S, 2 s), polls while the database stalls (each waits
# out the statement timeout, 2 s, and the second after it).
FROZEN_SUBMITS, STALLED_POLLS = 3, 2


def submit(client: httpx.Client, text: str, model: str) -> str:
    resp = client.post("/v1/audio/speech", headers=ASYNC, json={"model": model, "input": text})
    assert resp.status_code == 202, resp.text
    return resp.json()["id"]


def running(client: httpx.Client, job_id: str) -> bool:
    return client.get(f"/v1/jobs/{job_id}").json()["status"] == "running"


class Events:
    """An event stream of one job, read on a thread: each line with when it came."""

    def __init__(self, client: httpx.Client, job_id: str) -> None:
        self.lines: list[tuple[float, str]] = []
        self.thread = threading.Thread(target=self._read, args=(client, job_id), daemon=True)
        self.thread.start()

    def _read(self, client: httpx.Client, job_id: str) -> None:
        with client.stream("GET", f"/v1/jobs/{job_id}/events") as resp:
            for line in resp.iter_lines():
                self.lines.append((time.monotonic(), line))

    def first(self, text: str) -> float | None:
        return next((at for at, line in self.lines if line == text), None)


def test_redis_frozen_during_submissions(chaos: Chaos):
    """Redis is frozen while 40 jobs are submitted and another is rendering: every submit
    is answered 202 (committed; its publish left to the relay), a synchronous wait ends
    with its 202 at its deadline, the event stream of the running job ends with its output
    through the database resync while Redis is still frozen (no notice can arrive then),
    and after SIGCONT workers and maintenance carry on: every accepted job completes,
    once. Redis stays frozen until the output has come and three submits were answered
    while it was (the Load's jobs are test-instant: none is taken before the thaw, and
    their render time would only be waited out after it)."""
    key = chaos.new_key("frozen")
    with chaos.client(key) as c, chaos.client(key) as streaming:
        c.timeout = httpx.Timeout(ANSWER_DEADLINE_S)
        rendering = submit(c, "4", "test-sleep")
        wait_until(lambda: running(c, rendering), 60, "the job to be rendering")
        events = Events(streaming, rendering)
        wait_until(lambda: events.first("event: status"), 30, "the event stream")
        with Load(c, 40, 0.1, model="test-instant") as load:
            wait_until(lambda: len(load.statuses) >= 5, 30, "submits before the freeze")
            frozen_at = time.monotonic()
            chaos.redis.freeze()
            try:
                answered = len(load.statuses)
                waited = c.post("/v1/audio/speech", headers={"Prefer": "wait=2"},
                                json={"model": "test-fast", "input": "Waited on."})
                until(lambda: events.first("event: output") is not None
                      and len(load.statuses) >= answered + FROZEN_SUBMITS,
                      frozen_at + MAX_STALL_S - time.monotonic())
            finally:
                thawed_at = time.monotonic()
                chaos.redis.thaw()
        events.thread.join(60)
        assert len(load.statuses) == 40 and set(load.statuses) == {202}, load.statuses
        assert waited.status_code == 202, waited.text
        output_at = events.first("event: output")
        assert output_at is not None and output_at < thawed_at, events.lines
        ids = [rendering, waited.json()["id"], *load.accepted]
        longest = load.longest_answer_s(frozen_at, thawed_at)  # (not the 2 s wait)
        counts = tally(chaos, ids, settle(c, ids, 120), "redis_frozen",
                       max_answer_s=f"{longest:.2f}")
    assert counts.lost == 0 and counts.duplicated == 0
    assert counts.completed == counts.submitted == 42


def test_database_stalled_under_an_api_and_a_worker(chaos: Chaos):
    """An API process and a worker reach PostgreSQL through a proxy that stops forwarding
    (the rest of the deployment does not) until the worker has given its job up and the
    API has answered two polls and a submit: the API answers every request 503 with
    Retry-After within its bound, never hangs, and serves again afterwards; the worker's
    heartbeat cannot be confirmed, so it gives its running job up (the reaper hands it to
    a new attempt) instead of finishing it on a guess. Every accepted job completes,
    once."""
    proxy = Proxy(urlsplit(chaos.db_url).port)
    env = {**chaos.env, "OMNIJOBS_DATABASE_URL": through(chaos.db_url, proxy),
           "OMNIJOBS_DB_STATEMENT_TIMEOUT_S": "2", "OMNIJOBS_DB_TASK_STATEMENT_TIMEOUT_S": "2",
           "OMNIJOBS_DB_CONNECT_TIMEOUT_S": "2", "OMNIJOBS_AUTH_CACHE_TTL_S": "10"}
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    chaos.processes["api-stalled"] = spawn("api-stalled", ["api", "--port", str(port)], env,
                                           chaos.home)
    try:
        worker = chaos.start_worker("worker-stalled", ("test-slow",), env)
        wait_until(lambda: httpx.get(f"{base}/readyz", timeout=5).status_code == 200, 60,
                   "the proxied API")
        key = chaos.new_key("stalled")
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=base, headers=headers, timeout=ANSWER_DEADLINE_S) as c, \
                httpx.Client(base_url=base, headers=headers,
                             timeout=ANSWER_DEADLINE_S) as poller:
            slow = [submit(c, "Slow.", "test-slow") for _ in range(2)]
            wait_until(lambda: running(c, slow[0]), 60, "the worker to be rendering")
            with Load(c, 40, 0.1) as load:
                wait_until(lambda: len(load.statuses) >= 5, 30, "submits before the stall")
                stalled_at = time.monotonic()
                proxy.stall()
                polls: list[tuple[int, str | None, float]] = []

                def stalled_enough() -> bool:
                    return ("not renewed within" in worker.log.read_text()
                            and len(polls) >= STALLED_POLLS and 503 in load.statuses)

                try:
                    while (not stalled_enough()
                           and time.monotonic() < stalled_at + MAX_STALL_S):
                        sent = time.monotonic()
                        resp = poller.get(f"/v1/jobs/{slow[0]}")
                        polls.append((resp.status_code, resp.headers.get("retry-after"),
                                      time.monotonic() - sent))
                finally:
                    restored_at = time.monotonic()
                    proxy.restore()
            wait_until(lambda: c.get("/v1/jobs").status_code == 200, 60, "the API to serve")
        answers = list(zip(load.statuses, load.retry_after, strict=True))
        assert len(answers) == 40 and {s for s, _ in answers} <= {202, 503}, answers
        assert 503 in load.statuses and {s for s, _, _ in polls} == {503}, (answers, polls)
        assert all(int(r) >= 1 for s, r in answers if s == 503)
        assert all(int(r) >= 1 for _, r, _ in polls)
        longest = max(load.longest_answer_s(stalled_at, restored_at),
                      *(took for _, _, took in polls))
        with chaos.client(key) as direct:
            ids = [*slow, *load.accepted]
            final = settle(direct, ids, 120)
            counts = tally(chaos, ids, final, "database_stalled",
                           max_answer_s=f"{longest:.2f}")
        assert final[slow[0]]["attempts"] >= 2  # the stalled attempt was given up
        assert "not renewed within" in worker.log.read_text()
    finally:
        proxy.close()
        stop_all([chaos.processes.pop(name) for name in ("api-stalled", "worker-stalled")
                       if name in chaos.processes])
    assert counts.lost == 0 and counts.duplicated == 0
    assert counts.completed == counts.submitted
