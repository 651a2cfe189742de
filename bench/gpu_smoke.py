"""GPU smoke check: one Audex TTS, one Audex TTA and one T2VA job through real workers.

For a machine with a GPU, the ``[gpu]`` extra installed and the weights on disk (or
reachable). Each pipeline gets its own worker process (one engine per GPU at a time);
jobs go in through the API, as a client's would (so an unseeded video gets the random
seed the API draws, not the deploy's fixed 42). The script prints, per job: worker ready
time (process start -> engine loaded and warmed), job wall time (submit -> completed),
output duration, RMS and sample rate, worker shutdown time, and for a video the frames
and size the engine made (MiniMax-H3 renders 17n+5 frames at multiple-of-32 sizes: the
5 s, 1280x720 job comes back as 124 frames at 1280x704) and its seed.

    python -m bench.gpu_smoke \\
        --audex-model /models/Nemotron-Labs-Audex-2B --xcodec1-path /models/xcodec1 \\
        --t2va-model /models/MiniMax-H3 [--gpu 0] [--t2va-gpus 0,1,2,3,4,5] \\
        [--only audex-tts,audex-tta,minimax-h3] [--check]

The Audex deploys use one GPU (``--gpu``); ``minimax_h3_disaggregated.yaml`` spreads its
two stages over six (``--t2va-gpus``: encoder on the first two, DiT on the other four).
Audex TTA decodes with the external XCodec1 checkpoint: ``--xcodec1-path`` (or
``XCODEC1_PATH``) names a local copy; without one the engine fetches
``hf-audio/xcodec-hubert-general-balanced`` from the Hugging Face Hub.

``--check`` judges instead of only printing: per speech pipeline the default, an
unguided and a guided job (rate, channels, length, not silent), a cancel while a job
streams and the same engine's next job, and eight jobs at once; for H3 the frame grid,
size and A/V sync. It prints a PASS or FAIL line per check, every wait has a deadline,
and any FAIL exits 1 (docs/gpu.md, "Prove it on your GPU host"). The GPUs default to as
many as each deploy config names, and the script waits for a worker's GPU memory to be
released before it starts the next.

It runs on the embedded stack (SQLite, filesystem broker, local store) in a temporary
folder, so it needs no other service. ``--fake`` swaps in the CPU fake engine from the
tests, to check the script itself on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from omnijobs.released import wait_released

from .gpu_checks import Verdicts, check_speech, ended, judge_audio, judge_video, start

ROOT = Path(__file__).resolve().parent.parent
XCODEC1_REPO = "hf-audio/xcodec-hubert-general-balanced"
# Celery's own line once the worker consumes (celery/apps/worker.py: '%s ready.'), for the
# node name `omnijobs worker` gives it; a bare "ready" also matches "already".
READY = re.compile(r"omnijobs-\d+@\S+ ready\.")



def pipeline_options(args: argparse.Namespace) -> dict:
    fake = {}
    if args.fake:  # the fake at its named Hopper pace, so a long job is long enough to cancel
        from tests.fake_omni import STEP_BASE_S, STEP_PER_SEQ_S

        fake = {"engine_factory": "tests.fake_omni:make_engine",
                "tokenizer_factory": "tests.fake_omni:make_tokenizer",
                "engine_kwargs": {"step_cost_s": [STEP_BASE_S, STEP_PER_SEQ_S]}}
    return {
        "audex-tts": {"model": args.audex_model, "deploy_config": args.tts_deploy, **fake},
        "audex-tta": {"model": args.audex_model, "deploy_config": args.tta_deploy, **fake},
        "minimax-h3": {"model": args.t2va_model, "deploy_config": args.t2va_deploy, **fake},
    }


def xcodec1_env(args: argparse.Namespace, names: list[str]) -> dict[str, str]:
    """XCODEC1_PATH for the TTA worker, or why it will come from the Hub (or cannot)."""
    if "audex-tta" not in names or args.fake:
        return {}
    if args.xcodec1_path:
        return {"XCODEC1_PATH": args.xcodec1_path}
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise SystemExit(f"audex-tta decodes with XCodec1 ({XCODEC1_REPO}) and this host is "
                         "offline (HF_HUB_OFFLINE=1): pass --xcodec1-path or set XCODEC1_PATH")
    print(f"audex-tta: no --xcodec1-path or XCODEC1_PATH, so the engine fetches "
          f"{XCODEC1_REPO} from the Hugging Face Hub", file=sys.stderr)
    return {}


def wait_ready(proc: subprocess.Popen, log: Path, what: str, timeout_s: float,
               api: subprocess.Popen | None = None) -> None:
    """Until the worker's log has Celery's ready line, read as it grows (an engine's load
    logs a lot; each look reads only what was added since the last). An ``api`` starting
    meanwhile that exits ends the wait at once, not after the engine's load."""
    deadline = time.monotonic() + timeout_s
    with log.open("rb") as f:
        line = b""  # the last line read, or what of it was written yet
        while True:
            lines = (line + f.read()).split(b"\n")
            line = lines[-1]
            if any(READY.search(text.decode(errors="replace")) for text in lines):
                return
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited; see {log}")
            if api is not None and api.poll() is not None:
                raise RuntimeError(f"the API exited; see {log.parent / 'api.log'}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} not ready after {timeout_s:.0f} s; see {log}")
            time.sleep(0.1)


def stop(proc: subprocess.Popen, grace_s: float) -> tuple[float, bool]:
    """SIGTERM (the worker drains and shuts its engine down), then SIGKILL to the whole
    process group once ``grace_s`` has passed: a slow engine shutdown is reported, never
    raised. Returns (seconds taken, whether it had to be killed)."""
    started = time.monotonic()
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(grace_s)
        return time.monotonic() - started, False
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        return time.monotonic() - started, True


def spawn(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with log.open("wb") as out:  # its own process group, so a kill takes its children
        return subprocess.Popen([sys.executable, "-m", "omnijobs.cli", *argv], env=env,
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def run_one(name: str, env: dict[str, str], home: Path, gpu: str, api: httpx.Client,
            args: argparse.Namespace, server: subprocess.Popen | None = None,
            verdict: Verdicts | None = None) -> dict:
    from core.settings import Settings
    from media.probe import probe_audio, probe_video
    from media.validate import rms
    from pipelines import get_spec, import_pipeline_modules
    from storage.db import make_engine, make_sessionmaker
    from storage.objects import make_store
    from storage.repositories import JobRepository

    settings = Settings()
    import_pipeline_modules()
    spec = get_spec(name)
    log = home / f"{name}.log"
    started = time.monotonic()
    worker = spawn(["worker", "--pipeline", name, "--gpu", gpu], env, log)
    try:
        wait_ready(worker, log, f"{name} worker", args.ready_timeout, server)
        ready_s = time.monotonic() - started
        if server is not None:  # started with the first worker: up by now, or soon
            wait_api(server, api, home / "api.log", args.ready_timeout)
        submitted = time.monotonic()
        job = ended(api, start(api, name), args.job_timeout)
        wall_s = time.monotonic() - submitted
        if verdict is not None:
            judge = judge_video if spec.video else judge_audio
            verdict(name, "the default job", *judge(api, job, spec))
            if not spec.video:
                check_speech(name, api, spec, verdict, args.job_timeout)
    finally:
        stop_s, killed = stop(worker, args.shutdown_grace)
        wait_released(worker.pid)  # its stages' GPU memory, before the next worker loads
    row = {"pipeline": name, "status": job["status"], "ready_s": round(ready_s, 2),
           "wall_s": round(wall_s, 2), "error": (job.get("error") or {}).get("code"),
           "shutdown_s": round(stop_s, 2), "shutdown_killed": killed}
    done = JobRepository(make_sessionmaker(make_engine(settings.db_url))).get(job["id"])
    if done is not None and done.outputs:
        out = done.outputs[0]
        data = make_store(settings).get(out.key)
        audio = probe_video(data).audio if spec.video else probe_audio(data)
        row.update(duration_s=out.duration_s, sample_rate=out.sample_rate,
                   rms=round(rms(audio.samples), 4) if audio is not None else None)
        if spec.video:
            row.update(frames=out.frames, size=f"{out.width}x{out.height}",
                       seed=done.request.get("seed"))
    return row


def wait_api(server: subprocess.Popen, api: httpx.Client, log: Path,
             timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if server.poll() is not None:
            raise RuntimeError(f"the API exited; see {log}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the API not up after {timeout_s:.0f} s; see {log}")
        try:
            if api.get("/healthz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--audex-model", default="nvidia/Nemotron-Labs-Audex-2B")
    parser.add_argument("--tts-deploy", default="audex_tts.yaml")
    parser.add_argument("--tta-deploy", default="audex_tta.yaml")
    parser.add_argument("--xcodec1-path", default=os.environ.get("XCODEC1_PATH"),
                        help=f"local XCodec1 ({XCODEC1_REPO}) for the TTA decoder")
    parser.add_argument("--t2va-model", default="MiniMaxAI/MiniMax-H3")
    parser.add_argument("--t2va-deploy", default="minimax_h3_disaggregated.yaml")
    parser.add_argument("--only", default="audex-tts,audex-tta,minimax-h3")
    parser.add_argument("--gpu", help="GPUs of the Audex workers (default: as many as "
                        "their deploy config names, from 0)")
    parser.add_argument("--t2va-gpus", help="GPUs of the MiniMax-H3 worker (default: as "
                        "many as its deploy config names, six, from 0)")
    parser.add_argument("--check", action="store_true",
                        help="judge each output, cancel and concurrency, print PASS/FAIL "
                             "lines, and exit non-zero on any FAIL")
    parser.add_argument("--job-timeout", type=float, default=900.0,
                        help="seconds any one job may take before its check fails")
    parser.add_argument("--ready-timeout", type=float, default=3600.0,
                        help="seconds a worker may take to load and warm its engine")
    parser.add_argument("--shutdown-grace", type=float, default=180.0,
                        help="seconds a worker may take to shut its engine down")
    parser.add_argument("--fake", action="store_true", help="CPU fake engine (script check)")
    args = parser.parse_args()
    from pipelines.devices import gpus_needed

    def first(deploy: str) -> str:
        return ",".join(str(i) for i in range(gpus_needed(deploy)))
    args.gpu = args.gpu or first(args.tts_deploy)
    args.t2va_gpus = args.t2va_gpus or first(args.t2va_deploy)
    return args


def main() -> None:
    began = time.monotonic()
    args = parse_args()
    verdict = Verdicts() if args.check else None
    names = [n for n in args.only.split(",") if n]
    home = Path(tempfile.mkdtemp(prefix="omnijobs-smoke-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNIJOBS_")}
    env.update(PYTHONPATH=str(ROOT), OMNIJOBS_HOME=str(home),
               OMNIJOBS_PIPELINES=json.dumps(names),
               OMNIJOBS_PIPELINE_OPTIONS=json.dumps(pipeline_options(args)),
               **xcodec1_env(args, names))
    os.environ.update({k: v for k, v in env.items() if k.startswith("OMNIJOBS_")})
    from core.settings import Settings
    from storage.db import make_engine, make_sessionmaker
    from storage.migrate import upgrade
    from storage.repositories import KeyRepository

    upgrade(Settings().db_url)  # as `omnijobs migrate` does, without a process of its own
    _, key = KeyRepository(make_sessionmaker(make_engine(Settings().db_url))).create_key("smoke")
    port = free_port()
    # The API starts while the first worker loads (it needs no GPU); a job waits for both.
    server = spawn(["api", "--port", str(port)], env, home / "api.log")
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30,
                          headers={"Authorization": f"Bearer {key}"}) as api:
            rows = [run_one(name, env, home, args.t2va_gpus if name == "minimax-h3"
                            else args.gpu, api, args, server, verdict) for name in names]
    finally:
        stop(server, 30)
    print(json.dumps(rows, indent=2))
    print(f"logs: {home}")
    if verdict is not None:
        print(f"{verdict.passed} PASS, {verdict.failed} FAIL "
              f"({time.monotonic() - began:.0f} s in all)")
    completed = all(r["status"] == "completed" for r in rows)
    sys.exit(0 if completed and (verdict is None or not verdict.failed) else 1)


if __name__ == "__main__":
    main()
