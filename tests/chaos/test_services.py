"""Services break under load: Redis stops, SeaweedFS stops, PostgreSQL drops the
connections of the API and the workers. Nothing accepted is lost."""

from __future__ import annotations

import time

import psycopg

from ..services import pg_admin, wait_until
from .conftest import Chaos, Load, settle, tally, until


def test_redis_stopped_for_10s_during_submissions(chaos: Chaos):
    """The broker goes away while 50 jobs are submitted and rendered, and comes back
    empty (no persistence), losing the backlog it held: every submit is accepted (into
    the outbox while the broker is down) or refused with a 503, never a 500, and every
    accepted job completes, the lost messages re-sent by the stale-queued sweep.

    The backlog is 8 jobs of half a second each; the other 42 are test-instant jobs: none
    can be rendered before the broker is back, so their render time would only be
    waited out after it."""
    maintenance = chaos.processes["maintenance"].log
    resent_before = maintenance.read_text().count("its message is gone: re-sent")
    with chaos.client(chaos.new_key("redis")) as c:
        with Load(c, 50, 0.2, slow=8, slow_s=0.5, model="test-instant") as load:
            wait_until(lambda: len(load.statuses) >= 8, 30, "a backlog in the broker")
            chaos.redis.stop()
            time.sleep(10)  # the outage the test is named for
            chaos.redis.start()
        assert len(load.statuses) == 50 and set(load.statuses) <= {202, 503}, load.statuses
        counts = tally(chaos, load.accepted, settle(c, load.accepted, 150), "redis_stopped")
    assert counts.lost == 0 and counts.duplicated == 0
    assert counts.completed == counts.submitted >= 40
    assert maintenance.read_text().count("its message is gone: re-sent") > resent_before


def test_seaweedfs_stopped_during_uploads(chaos: Chaos):
    """The object store stops while results are being uploaded (SIGTERM: its gateway
    fails requests while it shuts down; then SIGKILL: nothing answers) and comes back
    once one upload has failed against it three times, so that upload's retries span
    longer than a lease (0.5 s, 1 s, then 2 s apart; OMNIJOBS_LEASE_S is 3) and at least
    one of them met the store gone: uploads are retried in place, holding the lease, and
    every job completes with a matching sha256 (``tally`` downloads each object and
    checks it)."""
    def worker_logs() -> str:
        return "".join(p.read_text() for p in chaos.home.glob("worker*.log"))

    def failures() -> int:
        return worker_logs().count("failed (")

    retries_before = failures()
    store = chaos.seaweedfs
    with chaos.client(chaos.new_key("seaweedfs")) as c:
        with Load(c, 20, 0.1) as load:
            wait_until(lambda: sum(j["status"] == "completed" for j in c.get(
                "/v1/jobs", params={"limit": 100}).json()["data"]) >= 2, 60,
                "results uploaded before the outage")
            store.proc.terminate()  # as ``halt`` does: SIGTERM, and SIGKILL 10 s later
            until(lambda: failures() > retries_before, 10)
            failed_before_kill = failures()
            store.proc.kill()
            store.proc.wait()
            until(lambda: failures() >= max(retries_before + 3, failed_before_kill + 1), 60)
        store.resume()
        final = settle(c, load.accepted, 150)
        counts = tally(chaos, load.accepted, final, "seaweedfs_stopped")
    assert counts.submitted == 20
    assert counts.completed == 20 and counts.lost == 0 and counts.duplicated == 0
    assert worker_logs().count("failed (") > retries_before  # the outage hit uploads
    # Retried in place: no job rendered twice because the store blinked.
    assert all(final[i]["attempts"] == 1 for i in load.accepted)


def test_postgres_connections_terminated_mid_load(chaos: Chaos):
    """Every connection the API, the workers and maintenance hold is terminated,
    repeatedly, while jobs are submitted and polled: 503 at worst, never a 500, and
    everything recovers without a restart."""
    name = chaos.db_url.rsplit("/", 1)[1]
    pids = {n: p.proc.pid for n, p in chaos.processes.items()}
    ready = {n: p.log.read_text().count(" ready.") for n, p in chaos.processes.items()}
    terminated = 0
    with chaos.client(chaos.new_key("postgres")) as c:
        polls: list[int] = []
        with Load(c, 30, 0.2) as load:
            with psycopg.connect(pg_admin(), autocommit=True) as admin:
                while load.thread.is_alive():
                    terminated += admin.execute(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                        "WHERE datname = %s AND pid <> pg_backend_pid()", (name,)
                    ).fetchone()[0]
                    polls += [c.get(f"/v1/jobs/{i}").status_code for i in load.accepted[-3:]]
                    time.sleep(0.5)
        assert terminated > 0
        assert set(load.statuses) <= {202, 503} and set(polls) <= {200, 503}, (
            load.statuses, polls)
        counts = tally(chaos, load.accepted, settle(c, load.accepted, 120), "postgres_killed")
    assert counts.lost == 0 and counts.duplicated == 0
    assert counts.completed == counts.submitted >= 20
    assert {n: p.proc.pid for n, p in chaos.processes.items()} == pids
    assert all(p.proc.poll() is None for p in chaos.processes.values())
    assert {n: p.log.read_text().count(" ready.") for n, p in chaos.processes.items()} == ready
