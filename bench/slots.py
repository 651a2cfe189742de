"""Engine slots: what does one Audex TTS worker gain by keeping jobs in flight together?

One worker, the batched fake engine (``tests/fake_omni.py``: each stage holds up to its
deploy's ``max_num_seqs``, 8 for ``audex_tts.yaml``; a guided request holds two; every
decode step emits one codec frame, 50 per second of audio, for each running request and
costs ``STEP_BASE_S + STEP_PER_SEQ_S x running sequences``, the fake's named Hopper
figures), ``--jobs`` queued Audex TTS jobs of ``--seconds`` of speech each (the fake
speaks 0.25 s per word: 4 s is 16 words), a ``--guided`` share of them with
``cfg_scale`` 3.0 (spread evenly through the queue). Three runs side by side, one after
the other in this process:

- **bare driver**: no service. The pipeline's own prompt and parameters
  (``pipelines.audex.AudexTTS`` on the fake factories, loaded and warmed up as a worker
  loads it) for every job, all submitted at once to the one engine on its loop: the
  engine queues what it cannot hold (FCFS), so it is always full. The ceiling.
- **slots=1** (today: Celery's solo pool, one job at a time) and **slots=8** (the worker
  keeps up to eight jobs in flight; a guided job takes two): a real ``omnijobs worker
  --pipeline audex-tts`` subprocess with the slot count as the pipeline option ``slots``,
  over a fresh PostgreSQL database per run, a private ``redis-server`` and SeaweedFS. Every
  job row and broker message is written before the worker starts (``JobRepository``,
  ``publish_and_mark``, the request built by the API's own ``speech_job``), so what is
  measured is the drain.

Figures, per run:

- **jobs/hour**: completed jobs x 3600 / span. The span of a service run is the first
  claim (the earliest ``started_at``: the worker is up and taking jobs) to the last
  ``completed_at``; of the bare driver, the first request into the engine to the last
  out. Worker start-up is in neither.
- **latency p50 / p99**: for a service job, ``completed_at`` minus the later of its
  ``created_at`` and the run's first claim (every job was queued before the worker came
  up, so this is the time from the start of the drain, as for the bare driver, whose
  latency is a request's in to out). ``created_at -> completed_at`` itself, which also
  counts the worker's start-up, is in the JSON.
- **engine peak sequences**: the most stage-0 sequences the engine held at once (its
  stats file; a guided request counts two).
- **overhead per job p50 / p99** (service runs): ``completed_at - started_at`` (claim to
  completed) minus the engine's own time for the job's request (its wall-clock in to out
  from the engine's stats file, waiting inside the engine included; the request id is
  ``<job id>-<8 hex>``). What is left is the service's: the claim, building the request,
  draining the outputs, validate, encode, upload and the bookkeeping around them.

Targets: slots=8 at least 5x slots=1 and at least 0.95x the bare driver in jobs/hour; the
overhead per job at most 15 ms (p50) with eight in flight. Nothing here asserts them.
The table and the verdicts are printed (with the machine's load average before and
after: on a shared machine it moves every figure); ``--json`` also writes every sample,
the overhead split at the engine (claim -> request in, request out -> completed) and
each service job's timeline in claim order.

Run: .venv/bin/python -m bench.slots [--jobs 200] [--seconds 4.0] [--guided 0.25]
     [--slots 1,8] [--format wav] [--json PATH]
Needs PostgreSQL as for the tests (``OMNIJOBS_TEST_PG`` overrides) and a ``redis-server``
binary; starts SeaweedFS itself. Full size takes about 7 minutes (slots=1 alone drains
200 x 200 frames at about 6.2 ms a step). ``FAKE_OMNI_STEP_COST_S`` is ignored: every run
uses the fake's named figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import uuid
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path

from pipelines.audex import AudexTTS
from tests.fake_omni import STEP_BASE_S, STEP_PER_SEQ_S

from .services import seaweedfs, start_redis
from .slots_service import (
    FAKE_OPTIONS,
    FRAMES_PER_S,
    GUIDED_CFG,
    STEP_COST_ENV,
    Outcome,
    Shared,
    Speech,
    service_run,
    workload,
)

TARGET_VS_ONE, TARGET_VS_BARE, TARGET_OVERHEAD_MS = 5.0, 0.95, 15.0

# ---- the bare driver ---------------------------------------------------------------------

def bare_run(work: list[Speech]) -> Outcome:
    """Every request at once on the engine's own loop, nothing around it: what the engine
    alone makes of the workload. The pipeline builds the prompts and parameters, so the
    engine sees exactly what a worker would send it."""
    pipe = AudexTTS(dict(FAKE_OPTIONS))
    pipe.load()  # builds the engine and sends the worker's warm-up request
    requests = []
    for i, speech in enumerate(work):
        request_id = f"bare{i:04d}-{uuid.uuid4().hex[:8]}"
        cond = pipe.cond_prompt(speech.text)
        params = pipe.request_params(cond, speech.text, GUIDED_CFG if speech.guided else None,
                                     request_id)
        requests.append((request_id, cond, params))
    engine = pipe._bridge.engine
    timings = pipe._bridge._run(_drive(engine, requests))
    mine = [timings[rid] for rid, _, _ in requests if rid in timings]
    span = max(t[2] for t in mine) - min(t[0] for t in mine) if mine else 0.0
    return Outcome("bare driver", len(work), len(mine), span,
                   [t[2] - t[0] for t in mine], engine.peak_seqs,
                   extra={"engine_steps": engine.scheduler_steps,
                          "step_cost_s": list(engine.step_cost_s)})


async def _drive(engine, requests: list[tuple[str, str, list]]) -> dict[str, list[float]]:
    """Submit every request, consume every output; the engine's own timings after."""

    async def one(request_id: str, prompt: str, params: list) -> None:
        async for _ in engine.generate({"prompt": prompt}, request_id=request_id,
                                       sampling_params_list=params,
                                       output_modalities=["audio"]):
            pass

    await asyncio.gather(*(one(*r) for r in requests))
    scheduler = engine.scheduler
    scheduler._task.cancel()  # the step loop, idle now: ended, not left pending at exit
    return dict(scheduler.timings)


# ---- the report --------------------------------------------------------------------------

def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def table(outcomes: list[Outcome]) -> str:
    lines = ["| run | jobs completed | jobs/hour | latency p50 | latency p99 | "
             "engine peak seqs | overhead/job p50 | overhead/job p99 |",
             "|---|---|---|---|---|---|---|---|"]
    for o in outcomes:
        s = o.summary()
        lines.append(f"| {o.name} | {o.completed}/{o.jobs} | {s['jobs_per_hour']:,.0f} | "
                     f"{s['latency_p50_s']:.2f} s | {s['latency_p99_s']:.2f} s | "
                     f"{'-' if o.peak_seqs is None else o.peak_seqs} | "
                     f"{_ms(s['overhead_p50_ms'])} | {_ms(s['overhead_p99_ms'])} |")
    return "\n".join(lines)


def verdicts(outcomes: list[Outcome]) -> dict:
    """The ratios against the targets: the most slots run against slots=1 and the bare
    driver, and its overhead per job."""
    by_name = {o.name: o for o in outcomes}
    services = [o for o in outcomes if o.name.startswith("slots=")]
    top = max(services, key=lambda o: int(o.name.split("=")[1]), default=None)
    if top is None or top.name == "slots=1":  # the targets are for jobs in flight together
        return {}
    out: dict = {"run": top.name}
    if (one := by_name.get("slots=1")) is not None and one is not top and one.jobs_per_hour:
        ratio = top.jobs_per_hour / one.jobs_per_hour
        out["vs_slots_1"] = {"ratio": round(ratio, 2), "target": TARGET_VS_ONE,
                             "met": ratio >= TARGET_VS_ONE}
    if (bare := by_name.get("bare driver")) is not None and bare.jobs_per_hour:
        ratio = top.jobs_per_hour / bare.jobs_per_hour
        out["vs_bare"] = {"ratio": round(ratio, 2), "target": TARGET_VS_BARE,
                          "met": ratio >= TARGET_VS_BARE}
    p50 = top.summary()["overhead_p50_ms"]
    if p50 is not None:
        out["overhead_p50_ms"] = {"value": p50, "target": TARGET_OVERHEAD_MS,
                                  "met": p50 <= TARGET_OVERHEAD_MS}
    return out


def verdict_lines(v: dict, outcomes: list[Outcome]) -> list[str]:
    lines = []
    if "vs_slots_1" in v:
        r = v["vs_slots_1"]
        lines.append(f"- {v['run']} / slots=1 jobs/hour: {r['ratio']:.2f}x "
                     f"(target ≥ {r['target']:g}x): {'met' if r['met'] else 'NOT met'}")
    if "vs_bare" in v:
        r = v["vs_bare"]
        lines.append(f"- {v['run']} / bare driver jobs/hour: {r['ratio']:.2f}x "
                     f"(target ≥ {r['target']:g}x): {'met' if r['met'] else 'NOT met'}")
    if "overhead_p50_ms" in v:
        r = v["overhead_p50_ms"]
        lines.append(f"- {v['run']} overhead per job (claim → completed beyond the engine's "
                     f"own time), p50: {r['value']:.1f} ms (target ≤ {r['target']:g} ms): "
                     f"{'met' if r['met'] else 'NOT met'}")
    top = next((o for o in outcomes if o.name == v.get("run")), None)
    if top is not None and top.overheads_ms:
        lines.append(f"  (p50 claim → request into the engine "
                     f"{top.extra['claim_to_engine_p50_ms']:.1f} ms, request out of the "
                     f"engine → completed {top.extra['engine_to_completed_p50_ms']:.1f} ms)")
    if top is not None and int(top.name.split("=")[1]) > 1 and (top.peak_seqs or 0) <= 2:
        lines.append(f"- note: {top.name} never held more than {top.peak_seqs} sequences: "
                     "this worker ran one job at a time (a build without engine slots?)")
    return lines


def report(outcomes: list[Outcome], args: argparse.Namespace) -> str:
    guided = sum(s.guided for s in workload(args.jobs, args.seconds, args.guided))
    head = (f"{args.jobs} Audex TTS jobs of {args.seconds:g} s of speech "
            f"({round(args.seconds * FRAMES_PER_S)} frames), {guided} guided "
            f"(cfg_scale {GUIDED_CFG:g}), {args.format}; fake step "
            f"{STEP_BASE_S * 1000:g} ms + {STEP_PER_SEQ_S * 1000:g} ms x sequences; "
            f"{os.cpu_count()} CPUs, load average {args.load_before:.1f} before, "
            f"{os.getloadavg()[0]:.1f} after (1 min)")
    v = verdicts(outcomes)
    return "\n".join([head, "", table(outcomes), "", *verdict_lines(v, outcomes),
                      "", "jobs/hour: first claim → last completed (bare: first request in "
                      "→ last out); latency: from the drain's start (the later of queued and "
                      "the first claim) to completed"])


# ---- main --------------------------------------------------------------------------------

def run_all(args: argparse.Namespace) -> list[Outcome]:
    """The bare driver first (in this process, no services up), then each slot count on
    services started once for all of them."""
    work = workload(args.jobs, args.seconds, args.guided)
    outcomes = [bare_run(work)]
    print(f"bare driver: {outcomes[-1].summary()}", file=sys.stderr, flush=True)
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(
            prefix="omnijobs-bench-slots-")))
        shared = Shared(workdir, start_redis(stack, workdir), seaweedfs(stack, workdir),
                        args.format)
        for slots in args.slots:
            outcomes.append(service_run(shared, work, slots, args.seconds))
            print(f"slots={slots}: {outcomes[-1].summary()}", file=sys.stderr, flush=True)
    return outcomes


def slot_list(value: str) -> list[int]:
    slots = [int(v) for v in value.split(",") if v.strip()]
    if not slots or min(slots) < 1:
        raise argparse.ArgumentTypeError("a comma-separated list of slot counts, each ≥ 1")
    return slots


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=4.0,
                        help="speech per job (the fake speaks 0.25 s a word)")
    parser.add_argument("--guided", type=float, default=0.25,
                        help=f"share of jobs with cfg_scale {GUIDED_CFG:g}")
    parser.add_argument("--slots", type=slot_list, default=[1, 8],
                        help="slot counts, one worker run each (comma-separated)")
    parser.add_argument("--format", default="wav", help="each job's response_format")
    parser.add_argument("--json", type=Path, help="write every figure and sample here")
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.seconds <= 0 or not 0 <= args.guided <= 1:
        parser.error("--jobs ≥ 1, --seconds > 0 and 0 ≤ --guided ≤ 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.pop(STEP_COST_ENV, None)  # the named figures, for the bare driver too
    args.load_before = os.getloadavg()[0]  # a shared machine's load moves the figures
    outcomes = run_all(args)
    print(report(outcomes, args))
    if args.json is not None:
        args.json.write_text(json.dumps({
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "cpu_count": os.cpu_count(), "load_after": os.getloadavg()[0],
            "runs": [o.summary() | {"extra": o.extra} for o in outcomes],
            "verdicts": verdicts(outcomes),
            "samples": [asdict(o) for o in outcomes]}, indent=1))


if __name__ == "__main__":
    main()
