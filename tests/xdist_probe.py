"""Run by tests/test_xdist_isolation.py under ``pytest -n 2 --dist each`` (every worker
runs it), never by the suite itself (the name does not match ``test_*.py``). Each xdist
worker marks the Redis database it is handed, waits until the other worker has marked its
own, and finds only its own mark; then it starts a stack, submits a job and gets its own
result back.

``PROBE_DIR`` is a folder both workers share (the barrier); ``PROBE_SHARED_DB`` makes
every worker draw that one database number, as the suite's old per-process pool of
databases 1-15 on one server did, and must fail."""

from __future__ import annotations

import os
from pathlib import Path

import redis

from tests import services
from tests.integration.helpers import wait_job

if shared := os.environ.get("PROBE_SHARED_DB"):
    services._OWN["redis_dbs"] = True
    services._FREE_REDIS_DBS[:] = [int(shared)]

WORKERS = 2


def test_each_worker_has_a_world_of_its_own(request):
    me = os.environ["PYTEST_XDIST_WORKER"]
    barrier = Path(os.environ["PROBE_DIR"])
    url = services.redis_url()
    client = redis.Redis.from_url(url)
    client.set(f"probe:{me}", url)
    (barrier / me).write_text(url)
    services.wait_until(lambda: len(list(barrier.iterdir())) == WORKERS, 120,
                        "the other xdist worker")
    marks = sorted(k.decode() for k in client.keys("probe:*"))
    assert marks == [f"probe:{me}"], f"{me} shares its Redis database ({url}): {marks}"

    stack = request.getfixturevalue("stack")
    assert stack.env["OMNIJOBS_BROKER_URL"] != url  # drawn from the same pool, another one
    with stack.client(stack.new_key(me)) as c:
        resp = c.post("/v1/audio/speech", headers={"Prefer": "respond-async"},
                      json={"model": "tts-1", "input": f"Worker {me} speaking.",
                            "voice": "alloy", "response_format": "wav",
                            "metadata": {"worker": me}})
        assert resp.status_code == 202, resp.text
        job = wait_job(c, resp.json()["id"], timeout=120)
    assert job["status"] == "completed", job
    assert job["metadata"] == {"worker": me} and len(job["outputs"]) == 1
    (barrier / f"{me}.job").write_text(job["id"])
