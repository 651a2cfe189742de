"""``omnijobs dev`` on a port of one's choosing, and the client commands run in its folder
finding it (its address and its key) with no --api or --key; then what a person sees
when it stops: each process saying so once, no Celery warning about root."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import httpx

from ..services import ROOT, free_port, wait_until


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNIJOBS_")}
    env.update(PYTHONPATH=str(ROOT), COLUMNS="120", **extra)
    return env


def test_make_dev_passes_its_port():
    # --no-print-directory: under `make test` a nested make would name its directory last
    shown = subprocess.run(["make", "--no-print-directory", "-n", "dev", "PORT=8137"],
                           cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip().splitlines()[-1].endswith("omnijobs dev --port 8137")


def test_dev_on_omnijobs_port_serves_the_batch_client_of_its_folder(tmp_path):
    port = free_port()
    log = tmp_path / "dev.log"
    with log.open("wb") as out:
        dev = subprocess.Popen([sys.executable, "-m", "omnijobs.cli", "dev"], cwd=tmp_path,
                               env=clean_env(OMNIJOBS_PORT=str(port)), stdout=out,
                               stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: httpx.get(f"{base}/readyz").status_code == 200, 90, "omnijobs dev")
        assert (tmp_path / ".omnijobs" / "dev-url").read_text().strip() == base
        wait_until(lambda: log.read_text().count(" ready.") >= 2, 60, "worker, maintenance")
        lines = [{"custom_id": f"line-{i}", "method": "POST", "url": "/v1/audio/speech",
                  "body": {"model": "tts-1", "voice": "alloy", "response_format": "wav",
                           "input": f"Line {i}."}} for i in range(2)]
        (tmp_path / "in.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        run = subprocess.run([sys.executable, "-m", "omnijobs.cli", "batch", "run",
                              "in.jsonl", "--out", "out"], cwd=tmp_path, env=clean_env(),
                             capture_output=True, text=True, timeout=180)
        assert run.returncode == 0, run.stdout + run.stderr
        assert sorted(p.name for p in (tmp_path / "out").glob("*.wav")) == [
            "line-0.wav", "line-1.wav"]
        batch_id = json.loads((tmp_path / "out" / ".omnijobs-batch.json").read_text())[
            "batch_id"]
        shown = subprocess.run([sys.executable, "-m", "omnijobs.cli", "batch", "status",
                                batch_id], cwd=tmp_path, env=clean_env(),
                               capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0 and "completed" in shown.stdout, shown
        elsewhere = subprocess.run([sys.executable, "-m", "omnijobs.cli", "batch", "status",
                                    batch_id, "--api", f"http://127.0.0.1:{free_port()}"],
                                   cwd=tmp_path, env=clean_env(), capture_output=True,
                                   text=True, timeout=60)
        assert "no API key" in elsewhere.stdout  # the dev key goes to the dev server only
    finally:
        dev.send_signal(signal.SIGINT)  # Ctrl-C
        dev.wait(60)
    printed = log.read_text()
    assert dev.returncode == 0, printed
    assert "superuser" not in printed and "SecurityWarning" not in printed
    assert "Warm shutdown" not in printed
    assert printed.count("draining: no more claims") == 1, printed
    assert printed.count("stopping: the maintenance steps end") == 1, printed
