"""bench/gpu_smoke.py stays runnable: its --fake mode drives real workers end to end."""

from __future__ import annotations

import json
import subprocess
import sys

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
    # the default H3 request (5 s, 1280x720) as the engine renders it: 124 frames, 1280x704
    assert (rows[1]["frames"], rows[1]["size"]) == (124, "1280x704")
