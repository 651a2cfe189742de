"""bench/gpu_smoke.py stays runnable: its --fake mode drives real workers end to end, and
its own checks (readiness, shutdown, the TTA decoder's weights) say what they mean."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

from bench.gpu_smoke import READY, stop, xcodec1_env

from ..services import ROOT


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


def smoke_check(*only: str, env: dict | None = None, extra: tuple[str, ...] = ()
                ) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "bench.gpu_smoke", "--fake", "--check",
                             "--only", ",".join(only), *extra],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def verdicts(proc: subprocess.Popen) -> tuple[int, dict[tuple[str, str], str], str]:
    """The exit code, each (pipeline, check) -> PASS or FAIL, and the whole output."""
    out, _ = proc.communicate(timeout=300)
    found = {}
    for line in out.splitlines():
        if line.startswith(("PASS ", "FAIL ")):
            head, what, _detail = line.split(": ", 2)
            verdict, pipeline = head.split()
            found[(pipeline, what)] = verdict
    return proc.returncode, found, out


SPEECH_CHECKS = ("the default job", "unguided job", "guided job", "cancel while it streams",
                 "the next job after the cancel", "8 jobs at once")


def test_the_check_passes_every_check_on_a_sound_engine():
    """Real workers (one per pipeline, one after the other) and the API, end to end."""
    code, got, out = verdicts(smoke_check("audex-tts", "minimax-h3"))
    assert got == {**{("audex-tts", what): "PASS" for what in SPEECH_CHECKS},
                   ("minimax-h3", "the default job"): "PASS"}
    assert code == 0 and "7 PASS, 0 FAIL" in out
    rows = json.loads(out[out.index("[\n"): out.rindex("]") + 1])
    assert [r["pipeline"] for r in rows] == ["audex-tts", "minimax-h3"]
    assert all(r["status"] == "completed" and r["rms"] > 0.01 for r in rows)
    assert [r["sample_rate"] for r in rows] == [16000, 32000]
    assert all(r["ready_s"] > 0 and r["wall_s"] > 0 for r in rows)
    assert not any(r["shutdown_killed"] for r in rows)
    # the default H3 request (5 s, 1280x720) as the engine renders it: 124 frames, 1280x704
    assert (rows[1]["frames"], rows[1]["size"]) == (124, "1280x704")
    # submitted through the API, which draws a seed: not the deploy's fixed 42
    assert isinstance(rows[1]["seed"], int) and rows[1]["seed"] != 42


def test_each_check_fails_when_its_thing_is_broken():
    """One thing broken at a time in the fake engine (FAKE_OMNI_BREAK), the three runs
    side by side: each fails the check that looks at it, and the script exits 1."""
    runs = {broken: smoke_check("audex-tts", env={**os.environ, "FAKE_OMNI_BREAK": broken},
                                extra=("--job-timeout", "10", "--shutdown-grace", "5"))
            for broken in ("silent", "rate", "stuck-cancel")}
    results = {broken: verdicts(proc) for broken, proc in runs.items()}
    assert {broken: code for broken, (code, _, _) in results.items()} == dict.fromkeys(runs, 1)
    silent, rate, stuck = ({what: v for (_, what), v in results[b][1].items()}
                           for b in ("silent", "rate", "stuck-cancel"))
    assert silent["the default job"] == silent["8 jobs at once"] == "FAIL"
    assert rate["the default job"] == rate["guided job"] == "FAIL"
    # the cancel itself is recorded, but the engine serves nothing after it
    assert stuck["the default job"] == stuck["cancel while it streams"] == "PASS"
    assert stuck["the next job after the cancel"] == stuck["8 jobs at once"] == "FAIL"
