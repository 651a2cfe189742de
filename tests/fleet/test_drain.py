"""Drain on scale-in, with real worker processes: SIGTERM stops the claims at once; the job
in flight finishes on the same worker when the drain allows it, or is handed back at
once (not after its lease runs out, and not as a failed attempt) and finished by
another worker, exactly once."""

from __future__ import annotations

import signal
import time
from datetime import UTC, datetime

from ..integration.helpers import EngineFiles
from ..services import wait_until
from .conftest import FleetStack, submit

JOB = "SELECT status, worker_id, lease_expires_at, attempts, max_attempts FROM jobs WHERE id = :id"


def messages(fleet: FleetStack, name: str, job_id: str) -> list[str]:
    return [r["message"] for r in fleet.records(name) if r.get("job_id") == job_id]


def test_a_short_drain_hands_the_job_back_to_another_worker(fleet: FleetStack):
    workers = [fleet.start_worker(f"drain-short-{i}", "test-sleep", OMNIJOBS_DRAIN_S="1")
               for i in range(2)]
    try:
        with fleet.client(fleet.new_key("drain-short")) as c:
            job_id = submit(c, "test-sleep", "10")
            wait_until(lambda: fleet.sql(JOB, id=job_id)[0] == "running", 30, "the job to run")
            _, first_id, lease_until, attempts, max_attempts = fleet.sql(JOB, id=job_id)
            [first] = [w for w in workers if first_id.endswith(f":{child_pid(w)}")]
            [other] = [w for w in workers if w is not first]
            first.proc.send_signal(signal.SIGTERM)
            assert first.proc.wait(30) == 0
            wait_until(lambda: fleet.sql(JOB, id=job_id)[1] not in (None, first_id), 30,
                       "the other worker to claim the handed-back job")
            claimed_at = datetime.now(UTC)
            final = wait_job(c, job_id)
        assert final["status"] == "completed"
        # Re-queued at once: claimed again long before the first lease would have run out.
        assert (lease_until - claimed_at).total_seconds() > 30
        # One more attempt allowed, since the handed-back one did not fail.
        assert (final["attempts"], final["max_attempts"]) == (attempts + 1, max_attempts + 1)
        assert f"job {job_id} handed back (the worker is stopping)" in messages(
            fleet, first.name, job_id)
        done = [m for w in workers for m in messages(fleet, w.name, job_id)
                if m == f"job {job_id} completed"]
        assert done == [f"job {job_id} completed"]  # exactly once, by the other worker
        assert f"job {job_id} completed" in messages(fleet, other.name, job_id)
    finally:
        for w in workers:
            w.stop()


def child_pid(worker) -> int:
    """The render process under the worker's supervisor."""
    with open(f"/proc/{worker.proc.pid}/task/{worker.proc.pid}/children") as f:
        return int(f.read().split()[0])


def test_enough_drain_finishes_the_job_and_claims_nothing_new(fleet: FleetStack):
    worker = fleet.start_worker("drain-long", "test-sleep")  # drain: the maximum runtime
    with fleet.client(fleet.new_key("drain-long")) as c:
        running = submit(c, "test-sleep", "4")
        wait_until(lambda: fleet.sql(JOB, id=running)[0] == "running", 30, "the job to run")
        waiting = [submit(c, "test-sleep", "1") for _ in range(3)]
        worker.proc.send_signal(signal.SIGTERM)
        assert worker.proc.wait(60) == 0
        assert wait_job(c, running)["status"] == "completed"
        assert f"job {running} completed" in messages(fleet, "drain-long", running)
        for job_id in waiting:  # nothing new was claimed while it drained
            assert fleet.sql(JOB, id=job_id)[0] == "queued"
            assert not [m for m in messages(fleet, "drain-long", job_id) if "claimed" in m]
        finisher = fleet.start_worker("drain-after", "test-sleep")
        try:
            assert {wait_job(c, j)["status"] for j in waiting} == {"completed"}
        finally:
            finisher.stop()


def wait_job(c, job_id: str) -> dict:
    terminal = ("completed", "failed", "cancelled")
    wait_until(lambda: c.get(f"/v1/jobs/{job_id}").json()["status"] in terminal, 60,
               f"job {job_id} to finish")
    return c.get(f"/v1/jobs/{job_id}").json()


AUDEX = "nvidia/Nemotron-Labs-Audex-2B"
SHORT = "Done within the drain."  # 1.25 s of speech: well under a second to decode
# 100 words, "[slow]" (699 characters, under the pipeline's 700): 25 s of speech at 10 ms
# a codec frame at least (the fake's steps are sleeps), so 12 s or more on any machine,
# far past the 4 s drain.
LONG = "[slow] " + " ".join(["slowly"] * 99)


def test_a_drain_with_eight_in_flight_finishes_some_and_hands_back_the_rest(
        fleet: FleetStack, tmp_path):
    """Eight Audex jobs in flight on one 8-slot worker when SIGTERM comes: the four that
    finish within OMNIJOBS_DRAIN_S complete there; the four that cannot are handed back
    at the bound (not failed), the process exits soon after, and another worker
    completes each of them once. The engine is held still until the signal, so all
    eight are in it when the drain begins."""
    engine = EngineFiles(tmp_path)
    first = fleet.start_worker("drain-slots", "audex-tts", OMNIJOBS_DRAIN_S="4",
                               OMNIJOBS_PIPELINE_OPTIONS=engine.pipeline_options(
                                   fleet.env["OMNIJOBS_PIPELINE_OPTIONS"]))
    assert "slots 8" in first.log.read_text()
    engine.hold.touch()  # after the start-up, whose warm-up request needs the engine running
    with fleet.client(fleet.new_key("drain-slots")) as c:
        long = [submit(c, AUDEX, LONG) for _ in range(4)]
        short = [submit(c, AUDEX, SHORT) for _ in range(4)]
        engine.wait_running(long + short)
        before = {j: fleet.sql(JOB, id=j) for j in long}
        signalled = time.monotonic()
        first.proc.send_signal(signal.SIGTERM)
        engine.hold.unlink()
        assert first.proc.wait(60) == 0
        # the drain's bound, the hand-back's grace (5 s) and the warm shutdown's margin
        assert time.monotonic() - signalled < 4 + 5 + 15
        for job_id in short:
            assert wait_job(c, job_id)["status"] == "completed"
            assert f"job {job_id} completed" in messages(fleet, "drain-slots", job_id)
        for job_id in long:
            assert f"job {job_id} handed back (the worker is stopping)" in messages(
                fleet, "drain-slots", job_id)
            assert fleet.sql(JOB, id=job_id)[0] == "queued"
        second = fleet.start_worker("drain-slots-after", "audex-tts")
        try:
            for job_id in long:
                final = wait_job(c, job_id)
                assert final["status"] == "completed", final
                *_, attempts, max_attempts = before[job_id]
                # one more attempt allowed: the handed-back one did not fail
                assert (final["attempts"], final["max_attempts"]) == (
                    attempts + 1, max_attempts + 1)
                done = [m for w in ("drain-slots", "drain-slots-after")
                        for m in messages(fleet, w, job_id) if m == f"job {job_id} completed"]
                assert done == [f"job {job_id} completed"]  # once, by the second worker
        finally:
            second.stop()
