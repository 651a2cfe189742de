"""The GPU smoke check's jobs and its judgements (``bench.gpu_smoke --check``): what it
submits through the API, how long it waits for each, and what it asks of each output,
as PASS or FAIL lines."""

from __future__ import annotations

import time

import httpx

from core.jobs import JobStatus

JOBS = {
    "audex-tts": ("/v1/audio/speech", {
        "model": "nvidia/Nemotron-Labs-Audex-2B", "response_format": "wav", "cfg_scale": 1.5,
        "input": "The quick brown fox jumps over the lazy dog. Omnijobs on a GPU."}),
    "audex-tta": ("/v1/audio/speech", {
        "model": "audex-tta", "response_format": "wav",
        "input": "Rain falling on a tin roof, distant thunder."}),
    "minimax-h3": ("/v1/videos", {
        "model": "MiniMaxAI/MiniMax-H3", "seconds": 5, "size": "1280x720", "fps": 24, "n": 1,
        "prompt": "A lighthouse at dusk, waves rolling in, gulls calling."}),
}


ENDED = tuple(s.value for s in JobStatus if s.terminal)


class Overdue(Exception):
    """A wait passed its deadline: the check that waited fails, and says so."""


def start(api: httpx.Client, name: str, **changes) -> str:
    """Submit the pipeline's job (with ``changes`` to its body) through the API."""
    path, body = JOBS[name]
    resp = api.post(path, json={**body, **changes}, headers={"Prefer": "respond-async"})
    resp.raise_for_status()
    return resp.json()["id"]


def wait_job(api: httpx.Client, job_id: str, timeout_s: float,
             until: tuple[str, ...] = ENDED) -> dict:
    deadline = time.monotonic() + timeout_s
    while (job := api.get(f"/v1/jobs/{job_id}").json())["status"] not in until:
        if time.monotonic() > deadline:
            raise Overdue(f"job {job_id} still {job['status']} after {timeout_s:.0f} s")
        time.sleep(0.2)
    return job


# About half a minute of speech: long enough to cancel while it streams.
LONG_TEXT = " ".join(["Omnijobs keeps every engine busy and records every job it runs."] * 10)
IN_FLIGHT = 8  # the Audex deploys' max_num_seqs: one worker's slots


class Verdicts:
    """PASS and FAIL lines, printed as they come; ``failed`` counts the FAILs."""

    def __init__(self) -> None:
        self.passed = self.failed = 0

    def __call__(self, pipeline: str, what: str, ok: bool, detail: str) -> bool:
        print(f"{'PASS' if ok else 'FAIL'} {pipeline}: {what}: {detail}", flush=True)
        self.passed += ok
        self.failed += not ok
        return ok


def judge_audio(api: httpx.Client, job: dict, spec) -> tuple[bool, str]:
    """A speech job's output as a client gets it: completed, the pipeline's rate and
    channels, a plausible length, and not silent."""
    from media.probe import probe_audio
    from media.validate import rms

    if job["status"] != "completed":
        return False, f"ended {job['status']} ({(job.get('error') or {}).get('code')})"
    audio = probe_audio(api.get(f"/v1/jobs/{job['id']}/content").content)
    level = rms(audio.samples)
    ok = (audio.sample_rate == spec.sample_rate and audio.channels == spec.channels
          and 0.3 <= audio.duration_s <= 60 and level > 0.005)
    return ok, (f"{audio.duration_s:.2f} s, {audio.sample_rate} Hz (expected "
                f"{spec.sample_rate}), {audio.channels} ch, rms {level:.3f}")


def judge_video(api: httpx.Client, job: dict, spec) -> tuple[bool, str]:
    """H3's contract: frames on its 17n+5 grid, a size on its multiple-of-32 grid (the
    one the job records), its audio rate, and the audio as long as the video: within one
    frame and the AAC codec's priming and padding, the service's own rule for a file."""
    from core.errors import OmniJobsError
    from media.probe import probe_video
    from media.validate import rms
    from media.verify import check_encoded_sync

    if job["status"] != "completed":
        return False, f"ended {job['status']} ({(job.get('error') or {}).get('code')})"
    probe = probe_video(api.get(f"/v1/jobs/{job['id']}/content").content)
    out = job["outputs"][0]
    audio = probe.audio
    drift = abs(audio.duration_s - probe.duration_s) if audio is not None else float("inf")
    try:
        check_encoded_sync(probe)
        in_sync = audio is not None
    except OmniJobsError:
        in_sync = False
    ok = (probe.frames % 17 == 5 and probe.width % 32 == 0 and probe.height % 32 == 0
          and (probe.width, probe.height, probe.frames) == (out["width"], out["height"],
                                                            out["frames"])
          and in_sync and audio.sample_rate == spec.sample_rate and rms(audio.samples) > 0.005)
    return ok, (f"{probe.frames} frames at {probe.width}x{probe.height}, {probe.fps:g} fps; "
                f"audio {audio.sample_rate if audio else '-'} Hz, A/V drift "
                f"{drift * 1000:.1f} ms")


def ended(api: httpx.Client, job_id: str, timeout_s: float) -> dict:
    """The job once it ends, or a stand-in that says it did not in time."""
    try:
        return wait_job(api, job_id, timeout_s)
    except Overdue as exc:
        return {"id": job_id, "status": "overdue", "error": {"code": str(exc)}}


def check_speech(name: str, api: httpx.Client, spec, verdict: Verdicts,
                 timeout_s: float) -> None:
    """Guided and unguided; a cancel while the job streams, then the same engine's next
    job; and IN_FLIGHT jobs at once, each with its own correct audio."""
    for label, cfg in (("unguided job", 1.0), ("guided job", 1.5)):
        verdict(name, label, *judge_audio(api, ended(api, start(api, name, cfg_scale=cfg),
                                                     timeout_s), spec))
    long_id = start(api, name, input=LONG_TEXT, cfg_scale=1.0)
    try:
        wait_job(api, long_id, timeout_s, until=("running", *ENDED))
        api.post(f"/v1/jobs/{long_id}/cancel").raise_for_status()
        status = wait_job(api, long_id, timeout_s)["status"]
    except Overdue as exc:
        status = str(exc)
    verdict(name, "cancel while it streams", status == "cancelled", f"ended {status}")
    verdict(name, "the next job after the cancel",
            *judge_audio(api, ended(api, start(api, name, cfg_scale=1.0), timeout_s), spec))
    started = time.monotonic()
    ids = [start(api, name, cfg_scale=1.0, input=f"{JOBS[name][1]['input']} Take {i}.")
           for i in range(IN_FLIGHT)]
    deadline = started + timeout_s  # together, as one job's bound: they run at once
    judged = [judge_audio(api, ended(api, job_id, max(0.0, deadline - time.monotonic())),
                          spec) for job_id in ids]
    good = sum(ok for ok, _ in judged)
    worst = next((detail for ok, detail in judged if not ok), "")
    verdict(name, f"{IN_FLIGHT} jobs at once", good == IN_FLIGHT,
            f"{good}/{IN_FLIGHT} correct in {time.monotonic() - started:.1f} s"
            + (f"; first wrong: {worst}" if worst else ""))
