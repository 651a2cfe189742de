"""bench.slots stays runnable: with a tiny workload the three runs come out, every job
completes, and the figures are positive and in order.

Nothing here is timed: whether slots=8 meets its targets is the benchmark's to say
(bench/slots.py), never a test's.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.fake_omni import STEP_BASE_S, STEP_PER_SEQ_S
from tests.services import ROOT, require_bench_tools

pytestmark = pytest.mark.integration

JOBS = 6
ROWS = ("bare driver", "slots=1", "slots=8")


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[dict, str]:
    require_bench_tools("redis-server")
    result = tmp_path_factory.mktemp("slots") / "slots.json"
    out = subprocess.run(
        [sys.executable, "-m", "bench.slots", "--jobs", str(JOBS), "--seconds", "0.5",
         "--slots", "1,8", "--json", str(result)],
        cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(result.read_text()), out.stdout


def test_three_runs_in_the_table(run):
    _, stdout = run
    assert "| run | jobs completed | jobs/hour |" in stdout
    for name in ROWS:
        assert f"| {name} | {JOBS}/{JOBS} |" in stdout, name


def test_every_run_completes_every_job_with_sane_figures(run):
    data, _ = run
    runs = {r["name"]: r for r in data["runs"]}
    assert list(runs) == list(ROWS)
    for name, r in runs.items():
        assert r["completed"] == r["jobs"] == JOBS, (name, r["extra"])
        assert r["span_s"] > 0 and r["jobs_per_hour"] > 0, name
        assert 0 < r["latency_p50_s"] <= r["latency_p99_s"], name
        assert 1 <= r["peak_seqs"] <= 8, name  # audex_tts.yaml's max_num_seqs


def test_service_runs_time_every_job_in_the_engine(run):
    data, _ = run
    for r in data["runs"][1:]:
        assert r["extra"]["engine_timed_jobs"] == JOBS, r["name"]
        assert r["overhead_p50_ms"] is not None, r["name"]
        assert r["overhead_p50_ms"] <= r["overhead_p99_ms"], r["name"]
    # one job at a time: one sequence, two for a guided job
    assert data["runs"][1]["peak_seqs"] <= 2


def test_ratios_are_reported_and_the_named_step_cost_is_used(run):
    data, stdout = run
    verdicts = data["verdicts"]
    assert verdicts["run"] == "slots=8"
    assert verdicts["vs_slots_1"]["ratio"] > 0 and verdicts["vs_bare"]["ratio"] > 0
    assert "slots=8 / slots=1 jobs/hour" in stdout and "slots=8 / bare driver" in stdout
    # the suite sets FAKE_OMNI_STEP_COST_S=0,0; the benchmark runs the named figures
    assert data["runs"][0]["extra"]["step_cost_s"] == [STEP_BASE_S, STEP_PER_SEQ_S]


def test_workload_is_the_issue_s():
    """200 jobs of 16 words (4 s of fake speech), every fourth guided."""
    from bench.slots_service import workload

    work = workload(200, 4.0, 0.25)
    assert len(work) == 200 and sum(s.guided for s in work) == 50
    assert [i for i, s in enumerate(work[:8]) if s.guided] == [3, 7]
    assert {len(s.text.split()) for s in work} == {16}
    assert work[3].body("wav")["cfg_scale"] == 3.0 and "cfg_scale" not in work[0].body("wav")


def test_the_worker_never_inherits_a_step_cost(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from bench.slots_service import Shared, worker_env

    monkeypatch.setenv("FAKE_OMNI_STEP_COST_S", "0,0")
    sw = SimpleNamespace(endpoint="http://127.0.0.1:1", access_key="k", secret_key="s")
    env = worker_env("postgresql://pg/db", "redis://r/1", Shared(tmp_path, None, sw, "wav"),
                     tmp_path, 8, tmp_path / "stats.json")
    assert "FAKE_OMNI_STEP_COST_S" not in env
    options = json.loads(env["OMNIJOBS_PIPELINE_OPTIONS"])["audex-tts"]
    assert options["slots"] == 8 and "step_cost_s" not in options["engine_kwargs"]
