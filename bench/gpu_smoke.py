"""GPU smoke check: one Audex TTS, one Audex TTA and one T2VA job through real workers.

For a machine with a GPU, the ``[gpu]`` extra installed and the weights on disk (or
reachable). Each pipeline gets its own worker process (one engine per GPU at a time);
the script prints, per job: worker ready time (process start -> engine loaded and
warmed), job wall time (submit -> completed), output duration, RMS and sample rate, and
for a video the frames and size the engine made (MiniMax-H3 renders 17n+5 frames at
multiple-of-32 sizes: the 5 s, 1280x720 job comes back as 124 frames at 1280x704).

    python -m bench.gpu_smoke \\
        --audex-model /models/Nemotron-Labs-Audex-2B \\
        --t2va-model /models/MiniMax-H3 [--gpu 0] [--t2va-gpus 0,1,2,3,4,5] \\
        [--only audex-tts,audex-tta,minimax-h3]

The Audex deploys use one GPU (``--gpu``); ``minimax_h3_disaggregated.yaml`` spreads its
two stages over six (``--t2va-gpus``: encoder on the first two, DiT on the other four).

It runs on the embedded stack (SQLite, filesystem broker, local store) in a temporary
folder, so it needs no other service. ``--fake`` swaps in the CPU fake engine from the
tests, to check the script itself on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

JOBS = {
    "audex-tts": {"input": "The quick brown fox jumps over the lazy dog. Omnijobs on a GPU.",
                  "response_format": "wav", "cfg_scale": 1.5},
    "audex-tta": {"input": "Rain falling on a tin roof, distant thunder.",
                  "response_format": "wav"},
    "minimax-h3": {"prompt": "A lighthouse at dusk, waves rolling in, gulls calling.",
                   "seconds": 5.0, "size": "1280x720", "fps": 24, "n": 1,
                   "generate_audio": True},
}


def pipeline_options(args: argparse.Namespace) -> dict:
    fake = {"engine_factory": "tests.fake_omni:make_engine",
            "tokenizer_factory": "tests.fake_omni:make_tokenizer"} if args.fake else {}
    return {
        "audex-tts": {"model": args.audex_model, "deploy_config": args.tts_deploy, **fake},
        "audex-tta": {"model": args.audex_model, "deploy_config": args.tta_deploy, **fake},
        "minimax-h3": {"model": args.t2va_model, "deploy_config": args.t2va_deploy, **fake},
    }


def run_one(name: str, env: dict[str, str], home: Path, gpu: str) -> dict:
    from core.settings import Settings
    from media.probe import probe_audio, probe_video
    from media.validate import rms
    from pipelines import get_spec, import_pipeline_modules
    from storage.db import make_engine, make_sessionmaker
    from storage.objects import make_store
    from storage.records import NewJob
    from storage.repositories import JobRepository, KeyRepository, OutboxRepository
    from tasks.app import make_celery
    from tasks.dispatch import publish_and_mark

    settings = Settings()
    import_pipeline_modules()
    sessions = make_sessionmaker(make_engine(settings.db_url))
    jobs, outbox = JobRepository(sessions), OutboxRepository(sessions)
    tenant, _ = KeyRepository(sessions).create_key("smoke")
    started = time.monotonic()
    with (home / f"{name}.log").open("wb") as log:
        worker = subprocess.Popen([sys.executable, "-m", "omnijobs.cli", "worker",
                                   "--pipeline", name, "--gpu", gpu], env=env, cwd=ROOT,
                                  stdout=log, stderr=subprocess.STDOUT)
    try:
        while "ready" not in (home / f"{name}.log").read_text(errors="replace"):
            if worker.poll() is not None:
                raise RuntimeError(f"{name} worker exited; see {home / (name + '.log')}")
            time.sleep(0.5)
        ready_s = time.monotonic() - started
        spec = get_spec(name)
        submitted = time.monotonic()
        job, msg = jobs.create(NewJob(tenant_id=tenant, kind=spec.kind, model=spec.models[0],
                                      pipeline=name, queue=spec.queue, request=JOBS[name],
                                      metadata=None, max_attempts=1))
        publish_and_mark(make_celery(settings), outbox, msg)
        while not (done := jobs.get(job.id)).status.terminal:
            time.sleep(0.2)
        wall_s = time.monotonic() - submitted
    finally:
        worker.terminate()
        worker.wait(120)
    row = {"pipeline": name, "status": done.status.value, "ready_s": round(ready_s, 2),
           "wall_s": round(wall_s, 2), "error": done.error_code}
    if done.outputs:
        out = done.outputs[0]
        data = make_store(settings).get(out.key)
        audio = probe_video(data).audio if spec.video else probe_audio(data)
        row.update(duration_s=out.duration_s, sample_rate=out.sample_rate,
                   rms=round(rms(audio.samples), 4) if audio is not None else None)
        if spec.video:
            row.update(frames=out.frames, size=f"{out.width}x{out.height}")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--audex-model", default="nvidia/Nemotron-Labs-Audex-2B")
    parser.add_argument("--tts-deploy", default="audex_tts.yaml")
    parser.add_argument("--tta-deploy", default="audex_tta.yaml")
    parser.add_argument("--t2va-model", default="MiniMaxAI/MiniMax-H3")
    parser.add_argument("--t2va-deploy", default="minimax_h3_disaggregated.yaml")
    parser.add_argument("--only", default="audex-tts,audex-tta,minimax-h3")
    parser.add_argument("--gpu", default="0", help="GPU of the Audex workers")
    parser.add_argument("--t2va-gpus", default="0,1,2,3,4,5",
                        help="GPUs of the MiniMax-H3 worker (its deploy uses six)")
    parser.add_argument("--fake", action="store_true", help="CPU fake engine (script check)")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="omnijobs-smoke-"))
    names = [n for n in args.only.split(",") if n]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNIJOBS_")}
    env.update(PYTHONPATH=str(ROOT), OMNIJOBS_HOME=str(home),
               OMNIJOBS_PIPELINES=json.dumps(names),
               OMNIJOBS_PIPELINE_OPTIONS=json.dumps(pipeline_options(args)))
    os.environ.update({k: v for k, v in env.items() if k.startswith("OMNIJOBS_")})
    subprocess.run([sys.executable, "-m", "omnijobs.cli", "migrate"], env=env, cwd=ROOT,
                   check=True, capture_output=True)
    rows = [run_one(name, env, home, args.t2va_gpus if name == "minimax-h3" else args.gpu)
            for name in names]
    print(json.dumps(rows, indent=2))
    print(f"logs: {home}")
    sys.exit(0 if all(r["status"] == "completed" for r in rows) else 1)


if __name__ == "__main__":
    main()
