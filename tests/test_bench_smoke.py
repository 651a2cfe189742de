"""bench.fastpaths stays runnable: with tiny loads every figure comes out, and positive.

Nothing here is timed: the figures themselves live in bench/README.md.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.services import checkout
from tests.services import ROOT, require_bench_tools

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[dict, str]:
    require_bench_tools("hey", "redis-server")
    out_dir = tmp_path_factory.mktemp("fastpaths")
    out = subprocess.run(
        [sys.executable, "-m", "bench.fastpaths", "--duration", "1s", "--connections", "4",
         "--submit-rounds", "2",
         "--sync-requests", "3", "--worker-jobs", "3", "--api-workers", "1", "--settle", "0",
         "--batch-lines", "200",
         "--results-dir", str(out_dir)],
        cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stderr[-4000:]
    [result] = out_dir.glob("fastpaths-*.json")
    data = json.loads(result.read_text())
    [figures] = data["sides"].values()
    return {f["key"]: f for f in figures}, out.stdout


def test_submit_figures_against_the_bare_baseline(run):
    figures, stdout = run
    for key in ("submit_bare", "submit", "submit_c1"):
        data = figures[key]["data"]
        assert data["accepted"] > 0 and data["accepted_per_s"] > 0, key
        assert 0 < data["p50_ms"] <= data["p99_ms"], key
    submit = figures["submit"]
    assert submit["data"]["throughput_ratio"] > 0 and submit["data"]["p99_ratio"] > 0
    assert len(submit["data"]["rounds"]) == len(figures["submit_bare"]["data"]["rounds"]) == 2
    assert submit["met"] in (True, False)
    for key in ("submit", "submit_bare"):
        counters = figures[key]["data"]["counters"]
        assert counters["transactions"] > 0 and counters["server_cpu_ms"] > 0, key
    assert "| figure | target | measured | ratio | met? |" in stdout


def test_api_workers_is_measured_or_refused_cleanly(run):
    figures, _ = run
    fig = figures["api_workers_1"]
    if fig["measured"] == "not supported by this build":
        assert fig["data"] == {"refused": "not supported by this build"}
    else:
        assert fig["data"]["accepted_per_s"] > 0


def test_render_figures_have_both_sides(run):
    figures, _ = run
    sync = figures["sync_speech"]["data"]
    assert len(sync["http_ms"]) == len(sync["in_process_ms"]) == 3
    assert sync["http_p50_ms"] > 0 and sync["in_process_p50_ms"] > 0
    worker = figures["worker_overhead"]["data"]
    assert len(worker["claim_to_completed_ms"]) == 3
    assert worker["claim_to_completed_p50_ms"] > 0 and worker["encode_alone_p50_ms"] > 0
    for part in ("finalize_alone_p50_ms", "probe_p50_ms", "upload_p50_ms"):
        assert worker[part] > 0, part


def test_batch_figure_is_measured(run):
    figures, _ = run
    data = figures["batch_upload"]["data"]
    assert data["lines"] == 200 and data["jobs_per_s"] > 0
    assert data["upload_to_all_queued_s"] >= data["upload_s"] > 0


def test_ref_checkout_is_a_separate_tree_and_is_removed(tmp_path):
    with checkout("HEAD", tmp_path) as tree:
        assert (tree.path / "omnijobs" / "cli.py").is_file()
        assert (tree.extra_path / f"{tree.pipeline_module}.py").is_file()
        assert tree.path != ROOT
    assert not (tmp_path / "ref").exists()
    listed = subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True,
                            text=True).stdout
    assert str(tmp_path) not in listed
