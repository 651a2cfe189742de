"""Eight Audex jobs in flight on one engine: a real worker process (Celery's threads,
PostgreSQL, Redis, SeaweedFS) keeps as many jobs in its engine as the deploy's
``max_num_seqs``, a guided job holding two, and each job stays a whole job: its own
cancel, its own chunks, its own audio.

The fake engine is held still (its hold file) while the jobs arrive, so what the worker
gave it can be read from its stats file before any of them finishes; then it runs."""

from __future__ import annotations

import csv
import io
import threading
import time
import uuid

import httpx
import pytest

from storage.db import make_engine, make_sessionmaker
from storage.repositories.shares import ShareRepository

from ..services import free_port, spawn, wait_until
from .helpers import EngineFiles, decode, render_seconds_counter, wait_job

AUDEX = "nvidia/Nemotron-Labs-Audex-2B"
WORD_S = 0.25  # the fake engine speaks a word in a quarter of a second


@pytest.fixture(scope="module")
def engine(stack, tmp_path_factory):
    """A worker serving Audex TTS with the deploy's 8 slots, its engine held until a test
    lets it run."""
    engine = EngineFiles(tmp_path_factory.mktemp("slots-engine"))
    env = dict(stack.env)
    env["OMNIJOBS_PIPELINE_OPTIONS"] = engine.pipeline_options(env["OMNIJOBS_PIPELINE_OPTIONS"])
    port = free_port()
    engine.metrics_url = f"http://127.0.0.1:{port}/metrics"
    proc = spawn("slots-worker", ["worker", "--pipeline", "audex-tts", "--metrics-port",
                                  str(port)], env, stack.processes["worker"].log.parent)
    stack.processes["slots-worker"] = proc
    wait_until(lambda: "ready" in proc.log.read_text(), 120, "slots worker")
    assert "slots 8" in proc.log.read_text()  # the deploy's max_num_seqs, as it starts
    yield engine
    engine.hold.unlink(missing_ok=True)
    proc.stop()
    del stack.processes["slots-worker"]


@pytest.fixture(scope="module")
def key(stack) -> str:
    return stack.new_key("slots-tenant")


@pytest.fixture
def held(engine):
    engine.hold.touch()
    yield engine
    engine.hold.unlink(missing_ok=True)


def words(i: int) -> str:
    """A text of its own for job ``i``: 3 + i words."""
    return " ".join(["Slot", "job", f"number{i}"] + ["word"] * i)


def submit(c: httpx.Client, text: str, **extra) -> str:
    resp = c.post("/v1/audio/speech", headers={"Prefer": "respond-async"},
                  json={"model": AUDEX, "input": text, "response_format": "wav", **extra})
    assert resp.status_code == 202, resp.text
    return resp.json()["id"]


def assert_spoken(c: httpx.Client, job_id: str, text: str) -> None:
    """Completed with the audio of its own text (its length, from its stored file)."""
    job = wait_job(c, job_id, timeout=60)
    assert job["status"] == "completed", job
    seconds = WORD_S * len(text.split())  # to the codec frame (20 ms)
    assert job["outputs"][0]["duration_s"] == pytest.approx(seconds, abs=0.021)
    audio = decode(c.get(f"/v1/jobs/{job_id}/content").content, "wav")
    assert audio.duration_s == pytest.approx(seconds, abs=0.021)


def test_eight_jobs_are_in_flight_at_once(stack, held, key):
    texts = [words(i) for i in range(8)]
    with stack.client(key) as c:
        ids = [submit(c, t) for t in texts]
        held.wait_running(ids)
        assert held.stats()["running_seqs"] == 8 and held.stats()["peak_seqs"] == 8
        assert all(c.get(f"/v1/jobs/{i}").json()["status"] == "running" for i in ids)
        held.hold.unlink()
        for job_id, text in zip(ids, texts, strict=True):
            assert_spoken(c, job_id, text)
    assert held.stats()["peak_seqs"] == 8  # never more than the deploy allows


def test_four_guided_jobs_fill_eight_sequences(stack, held, key):
    """A guided job holds two slots: four fill the engine, and a fifth job is not
    claimed (the worker holds no job it cannot start) until a pair ends."""
    texts = [words(i) for i in range(5)]
    with stack.client(key) as c:
        guided = [submit(c, t, cfg_scale=3.0) for t in texts[:4]]
        held.wait_running(guided)
        assert held.stats()["running_seqs"] == 8
        fifth = submit(c, texts[4])
        assert held.stats()["waiting"] == []  # nothing queued inside the engine
        assert c.get(f"/v1/jobs/{fifth}").json()["status"] == "queued"
        held.hold.unlink()
        for job_id, text in zip([*guided, fifth], texts, strict=True):
            assert_spoken(c, job_id, text)
    assert held.stats()["peak_seqs"] == 8


def test_one_cancel_among_eight_ends_only_that_job(stack, held, key):
    texts = [words(i) for i in range(8)]
    with stack.client(key) as c:
        ids = [submit(c, t) for t in texts]
        held.wait_running(ids)
        victim = ids[3]
        assert c.post(f"/v1/jobs/{victim}/cancel").json()["status"] == "cancelled"
        # its engine request is aborted; the seven others stay in the engine
        wait_until(lambda: held.running(ids) == [i for i in ids if i != victim], 30,
                   "the cancelled job's engine request to end")
        held.hold.unlink()
        for job_id, text in zip(ids, texts, strict=True):
            if job_id != victim:
                assert_spoken(c, job_id, text)
        assert wait_job(c, victim)["status"] == "cancelled"
        assert c.get(f"/v1/jobs/{victim}/content").status_code in (404, 409)


def test_two_streams_in_flight_each_get_their_own_chunks_in_order(stack, held, key):
    """Two streamed jobs decode in the engine together: each client's bytes are its own
    job's stored audio exactly (its chunks, in order), and differ from the other's."""
    texts = [words(9), words(12)]
    got: dict[int, tuple[str, bytes]] = {}

    def stream(i: int) -> None:
        with httpx.Client(base_url=stack.base_url, timeout=60,
                          headers={"Authorization": f"Bearer {key}"}) as c, c.stream(
                "POST", "/v1/audio/speech", json={
                    "model": AUDEX, "input": texts[i], "response_format": "pcm",
                    "stream_format": "audio"}) as resp:
            assert resp.status_code == 200, resp.read()
            got[i] = (resp.headers["x-job-id"], b"".join(resp.iter_bytes()))

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    with stack.client(key) as c:
        wait_until(lambda: len(held.stats()["running"]) >= 2, 60, "both streams in the engine")
        held.hold.unlink()
        for t in threads:
            t.join(60)
        assert sorted(got) == [0, 1], "a stream did not finish"
        for i, (job_id, data) in got.items():
            job = wait_job(c, job_id)
            assert job["status"] == "completed", job
            assert data == c.get(f"/v1/jobs/{job_id}/content").content
            assert job["outputs"][0]["duration_s"] == pytest.approx(
                WORD_S * len(texts[i].split()), abs=0.021)
    assert got[0][1] != got[1][1][:len(got[0][1])]  # two voices, not one stream twice


def test_slots_that_free_together_claim_in_fair_order_by_weight(stack, held, key):
    """Eight slots free at once (their jobs cancelled) while two tenants wait: the
    slots go by the fair share, not by the queue's order. The weight-1 tenant queued all
    of its jobs first, and still the weight-3 tenant gets six of the eight (stride
    order: three claims of the heavy tenant for each of the light one's)."""
    suffix = uuid.uuid4().hex[:8]
    light, heavy = f"slots-light-{suffix}", f"slots-heavy-{suffix}"
    light_key, heavy_key = stack.new_key(light), stack.new_key(heavy)
    engine = make_engine(stack.env["OMNIJOBS_DATABASE_URL"])
    try:  # as `omnijobs tenants weight` sets it, without a CLI process
        ShareRepository(make_sessionmaker(engine)).set_weight(heavy, 3)
    finally:
        engine.dispose()
    with stack.client(key) as c, stack.client(light_key) as lc, \
            stack.client(heavy_key) as hc:
        fillers = [submit(c, words(i)) for i in range(8)]
        held.wait_running(fillers)
        light_ids = [submit(lc, words(i)) for i in range(8)]
        heavy_ids = [submit(hc, words(i)) for i in range(8)]
        for job_id in fillers:
            assert c.post(f"/v1/jobs/{job_id}/cancel").json()["status"] == "cancelled"
        waiting = light_ids + heavy_ids
        wait_until(lambda: len(held.running(waiting)) == 8, 60, "eight new jobs in the engine")
        running = held.running(waiting)
        split = (sum(j in heavy_ids for j in running), sum(j in light_ids for j in running))
        held.hold.unlink()
        for job_id, text in zip(waiting, [words(i) for i in range(8)] * 2, strict=True):
            assert_spoken(lc if job_id in light_ids else hc, job_id, text)
    assert split == (6, 2), split


def test_usage_of_eight_overlapping_jobs_is_each_jobs_own_time_and_agrees(stack, held, key):
    """Eight jobs in flight together on one engine: each is charged its own wall time in
    flight (docs/deadlines-and-usage.md), so their seconds add up past the engine's, and
    the job records, ``GET /v1/usage``, ``omnijobs usage`` and the worker's counter
    agree on the sum."""
    tenant = "usage-slots-" + uuid.uuid4().hex[:8]
    before = render_seconds_counter(held.metrics_url, "audex-tts")
    start = int(time.time()) // 3600 * 3600
    with stack.client(stack.new_key(tenant)) as c:
        ids = [submit(c, words(i)) for i in range(8)]
        held.wait_running(ids)  # all eight hold a slot at once
        held.hold.unlink()
        jobs = [wait_job(c, job_id, 60) for job_id in ids]
        assert {j["status"] for j in jobs} == {"completed"}
        per_job = sum(j["usage"]["render_seconds"] for j in jobs)
        page = c.get("/v1/usage", params={"start_time": start, "bucket_width": "1h",
                                          "group_by": "pipeline"}).json()
        rows = [r for b in page["data"] for r in b["results"] if r["pipeline"] == "audex-tts"]
        assert sum(r["num_jobs"] for r in rows) == 8
        assert sum(r["render_seconds"] for r in rows) == pytest.approx(per_job, abs=1e-6)
    assert all(j["usage"]["render_seconds"] > 0 for j in jobs)
    rows = list(csv.DictReader(io.StringIO(stack.cli(
        "usage", "--tenant", tenant, "--since", "1d", "--bucket", "1h", "--csv",
        "--group-by", "pipeline"))))
    assert sum(float(r["render_seconds"]) for r in rows if r["pipeline"] == "audex-tts") \
        == pytest.approx(per_job, abs=1e-3 * len(rows))  # the CSV rounds to milliseconds
    wait_until(lambda: render_seconds_counter(held.metrics_url, "audex-tts") - before
               == pytest.approx(per_job, abs=1e-6), 10, "the counter to add the eight")


def test_an_engine_death_with_eight_in_flight_requeues_all_eight(stack, held, key):
    """The engine dies with eight jobs in it: each fails with the retryable engine_dead
    and is queued again, none lost; the worker exits for a restart, its supervisor starts
    a fresh one, and each job completes once, on its second attempt. (Last in the module:
    the worker it leaves is the fresh one.)"""
    texts = [words(i) for i in range(7)] + ["[die] " + words(7)]
    worker = stack.processes["slots-worker"]
    with stack.client(key) as c:
        ids = [submit(c, t) for t in texts[:7]]
        held.wait_running(ids)
        ids.append(submit(c, texts[7]))  # its request kills the engine with seven in it
        wait_until(held.died.exists, 60, "the engine to die")
        held.hold.unlink()
        for job_id, text in zip(ids, texts, strict=True):
            assert_spoken(c, job_id, text)
            job = c.get(f"/v1/jobs/{job_id}").json()
            assert job["attempts"] == 2, job
    log = worker.log.read_text()
    assert log.count("engine_dead") >= 8 and "starting a fresh one" in log
    assert worker.proc.poll() is None  # the supervisor lives on
