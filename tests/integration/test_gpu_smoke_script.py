"""bench/gpu_smoke.py stays runnable: its --fake mode drives real workers end to end, and
its own checks (readiness, shutdown, the TTA decoder's weights) say what they mean."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from bench.gpu_smoke import READY, stop, xcodec1_env

from ..services import ROOT


def test_gpu_smoke_script_runs_with_the_fake_engine():
    out = subprocess.run([sys.executable, "-m", "bench.gpu_smoke", "--fake", "--only",
                          "audex-tts,minimax-h3"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = json.loads(out.stdout[: out.stdout.rindex("]") + 1])
    assert [r["pipeline"] for r in rows] == ["audex-tts", "minimax-h3"]
    assert all(r["status"] == "completed" and r["rms"] > 0.01 for r in rows)
    assert [r["sample_rate"] for r in rows] == [16000, 32000]
    assert all(r["ready_s"] > 0 and r["wall_s"] > 0 for r in rows)
    assert not any(r["shutdown_killed"] for r in rows)
    # the default H3 request (5 s, 1280x720) as the engine renders it: 124 frames, 1280x704
    assert (rows[1]["frames"], rows[1]["size"]) == (124, "1280x704")
    # submitted through the API, which draws a seed: not the deploy's fixed 42
    assert isinstance(rows[1]["seed"], int) and rows[1]["seed"] != 42


def test_readiness_is_celerys_ready_line_not_any_ready():
    assert READY.search('{"message": "omnijobs-4242@gpu-host-1 ready.", "level": "INFO"}')
    for line in ("INFO engine already loaded", "weights ready to load",
                 "omnijobs: already at the latest revision (0005)", "celery@host ready."):
        assert not READY.search(line), line


def test_a_slow_shutdown_is_reported_not_raised():
    proc = subprocess.Popen([sys.executable, "-c",
                             "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                             "print('up', flush=True)\ntime.sleep(60)"],
                            stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout.readline() == b"up\n"  # its SIGTERM handler is in place
    took, killed = stop(proc, grace_s=0.5)
    assert killed and proc.returncode == -9 and took >= 0.5


def test_the_tta_decoders_weights_are_passed_or_named(monkeypatch, capsys):
    args = argparse.Namespace(fake=False, xcodec1_path="/models/xcodec1")
    assert xcodec1_env(args, ["audex-tta"]) == {"XCODEC1_PATH": "/models/xcodec1"}
    assert xcodec1_env(args, ["audex-tts"]) == {}
    args.xcodec1_path = None
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert xcodec1_env(args, ["audex-tta"]) == {}
    assert "hf-audio/xcodec-hubert-general-balanced from the Hugging Face Hub" in (
        capsys.readouterr().err)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SystemExit, match="pass --xcodec1-path or set XCODEC1_PATH"):
        xcodec1_env(args, ["audex-tta"])
