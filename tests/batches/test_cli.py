"""``omnijobs batch`` against the running stack, over HTTP only: a 20-line batch end to
end, then a re-run that renders nothing and repairs a deleted, a truncated and a
corrupted output; resuming after the CLI was killed; status, cancel and failures."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import text

from ..services import ROOT, wait_until
from .conftest import jsonl, speech_line

LINES = 20


def cli_env(batch_stack, key: str) -> dict[str, str]:
    return {**batch_stack.env, "OMNIJOBS_API_URL": batch_stack.base_url,
            "OMNIJOBS_API_KEY": key, "COLUMNS": "100"}


def omnijobs(env: dict, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "omnijobs.cli", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def counts(db, tenant_key_prefix: str = "") -> tuple[int, int]:
    """(batches, jobs) in the stack, to show a re-run creates neither."""
    with db.connect() as conn:
        return (conn.execute(text("SELECT count(*) FROM batches")).scalar_one(),
                conn.execute(text("SELECT count(*) FROM jobs")).scalar_one())


def write_input(path: Path, n: int, **body) -> Path:
    path.write_bytes(jsonl([speech_line(f"chapter-{i:02d}", input=f"This is chapter {i}.",
                                        **body) for i in range(n)]))
    return path


def started_run(env: dict[str, str], source: Path, out: Path,
                **output) -> tuple[subprocess.Popen, str]:
    """``omnijobs batch run`` left running, once it has created its batch: (the process,
    the batch id). Ctrl-C reaches it as a terminal sends it, whatever the suite inherited:
    a shell's background job starts with SIGINT ignored, and Python then leaves it
    ignored."""
    proc = subprocess.Popen([sys.executable, "-m", "omnijobs.cli", "batch", "run", str(source),
                             "--out", str(out)], env=env, cwd=ROOT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
                            **output)
    state = out / ".omnijobs-batch.json"
    wait_until(lambda: "batch_id" in json.loads(state.read_text()), 60, "the batch id")
    return proc, json.loads(state.read_text())["batch_id"]


def test_run_then_rerun_renders_nothing_and_repairs_files(batch_stack, key, db, tmp_path):
    env = cli_env(batch_stack, key)
    source, out = write_input(tmp_path / "book.jsonl", LINES), tmp_path / "out"
    first = omnijobs(env, "batch", "run", str(source), "--out", str(out))
    print(f"\n$ omnijobs batch run book.jsonl --out out\n{first.stdout}{first.stderr}")
    assert first.returncode == 0, first.stdout + first.stderr
    manifest = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert [m["custom_id"] for m in manifest] == [f"chapter-{i:02d}" for i in range(LINES)]
    for entry in manifest:
        [f] = entry["files"]
        assert entry["status"] == "completed" and f["path"] == f"{entry['custom_id']}.wav"
        assert sha256(out / f["path"]) == f["sha256"]
        assert (out / f["path"]).stat().st_size == f["bytes"]
    assert "completed" in first.stdout and str(LINES) in first.stdout
    before = counts(db)

    (out / "chapter-03.wav").unlink()
    truncated = out / "chapter-07.wav"
    truncated.write_bytes(truncated.read_bytes()[:1000])
    corrupted = out / "chapter-11.wav"
    data = bytearray(corrupted.read_bytes())
    data[-1] ^= 0xFF
    corrupted.write_bytes(bytes(data))
    untouched = {p.name: p.stat().st_mtime_ns for p in out.glob("*.wav")
                 if p.name not in ("chapter-07.wav", "chapter-11.wav")}

    again = omnijobs(env, "batch", "run", str(source), "--out", str(out))
    print(f"\n$ omnijobs batch run book.jsonl --out out   # again\n{again.stdout}{again.stderr}")
    assert again.returncode == 0, again.stdout + again.stderr
    assert counts(db) == before  # no new batch, no new job: nothing rendered again
    lines = again.stdout.splitlines()
    assert any("files downloaded" in x and x.rstrip(" │").endswith(" 3") for x in lines)
    assert any("files already here" in x and x.rstrip(" │").endswith(f" {LINES - 3}")
               for x in lines)
    for entry in manifest:
        assert sha256(out / entry["files"][0]["path"]) == entry["files"][0]["sha256"]
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("*.wav")
            if p.name in untouched} == untouched  # intact files were not rewritten
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == [
        ".omnijobs-batch.json"]  # no temporary file left behind


def test_a_killed_run_resumes_its_batch(batch_stack, key, db, tmp_path):
    env = cli_env(batch_stack, key)
    source, out = write_input(tmp_path / "resume.jsonl", 6), tmp_path / "out"
    batches_before = counts(db)[0]
    proc, batch_id = started_run(env, source, out, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    resumed = omnijobs(env, "batch", "run", str(source), "--out", str(out))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert batch_id in resumed.stdout and counts(db)[0] == batches_before + 1
    assert len(list(out.glob("chapter-*.wav"))) == 6


def test_status_cancel_and_failures(batch_stack, key, tmp_path):
    env = cli_env(batch_stack, key)
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(jsonl([speech_line("fine", input="Fine."),
                           speech_line("too-fast", input="x", speed=9)]))
    run = omnijobs(env, "batch", "run", str(bad), "--out", str(tmp_path / "bad"))
    assert run.returncode == 1, run.stdout + run.stderr
    manifest = {m["custom_id"]: m for m in map(json.loads, (
        tmp_path / "bad" / "manifest.jsonl").read_text().splitlines())}
    assert manifest["fine"]["status"] == "completed"
    assert manifest["too-fast"]["status"] == "failed"
    assert manifest["too-fast"]["error"]["param"] == "speed"  # the endpoint's own 400

    slow = write_input(tmp_path / "slow.jsonl", 3, model="test-slow")  # never rendered here
    runner, batch_id = started_run(env, slow, tmp_path / "slow", stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
    shown = omnijobs(env, "batch", "status", batch_id)
    assert shown.returncode == 0 and batch_id in shown.stdout
    cancelled = omnijobs(env, "batch", "cancel", batch_id)
    assert cancelled.returncode == 0 and "cancel" in cancelled.stdout
    output, _ = runner.communicate(timeout=60)
    assert runner.returncode == 1, output  # every request cancelled: none completed
    assert "batch_cancelled" in output
    deadline = time.monotonic() + 30
    while "cancelled" not in (shown := omnijobs(env, "batch", "status", batch_id)).stdout:
        assert time.monotonic() < deadline, shown.stdout
    assert omnijobs(env, "batch", "status", "batch_nope").returncode == 2


def test_ctrl_c_says_the_batch_keeps_running_and_how_to_resume(batch_stack, key, tmp_path):
    env = cli_env(batch_stack, key)
    slow = write_input(tmp_path / "slow.jsonl", 2, model="test-slow")  # never rendered here
    runner, batch_id = started_run(env, slow, tmp_path / "slow", stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
    try:
        runner.send_signal(signal.SIGINT)
        output, _ = runner.communicate(timeout=60)
        assert runner.returncode == 130, output
        last = output.strip().splitlines()[-1]
        assert f"batch {batch_id} keeps running" in last, output
        assert "run the same command again to resume" in last
        assert f"omnijobs batch cancel {batch_id}" in last and "Traceback" not in output
        shown = omnijobs(env, "batch", "status", batch_id)
        assert "in_progress" in shown.stdout or "validating" in shown.stdout, shown.stdout
    finally:
        omnijobs(env, "batch", "cancel", batch_id)
