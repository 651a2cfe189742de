"""Test-only pipelines, imported by the worker through OMNIJOBS_PIPELINE_MODULES."""

from __future__ import annotations

import logging
import time

import numpy as np

from core.errors import JobCancelled
from core.jobs import JobKind
from pipelines import Pipeline, PipelineSpec, VideoLimits, register_pipeline
from pipelines.base import OPENAI_VOICES, AudioPiece


@register_pipeline
class SilentSpeech(Pipeline):
    """Produces a second of digital silence: the service must call that a failure."""

    spec = PipelineSpec(name="test-silent", kind=JobKind.SPEECH, models=("test-silent",),
                        sample_rate=16000, voices=OPENAI_VOICES)

    def speech(self, request, ctx):
        yield AudioPiece(np.zeros(16000, dtype=np.float32), 16000)


log = logging.getLogger(__name__)


@register_pipeline
class SlowTone(Pipeline):
    """A tone produced slowly, one chunk per 0.5 s: long enough to kill a worker mid-job.
    Stops at the next chunk once cancelled, and logs how far it got."""

    spec = PipelineSpec(name="test-slow", kind=JobKind.SPEECH, models=("test-slow",),
                        sample_rate=16000, voices=OPENAI_VOICES)

    def speech(self, request, ctx):
        t = np.arange(8000) / 16000
        for i in range(8):
            time.sleep(0.5)
            if ctx.is_cancelled():
                log.info("test-slow stopped after %d of 8 chunks", i,
                         extra={"job_id": ctx.job_id})
                raise JobCancelled("cancelled")
            ctx.report_progress((i + 1) / 8)
            yield AudioPiece((0.3 * np.sin(2 * np.pi * 330 * t)).astype(np.float32), 16000)


@register_pipeline
class Sleeper(Pipeline):
    """Works for as many seconds as its input says (default 1), watching for a cancel,
    then says half a second of tone."""

    spec = PipelineSpec(name="test-sleep", kind=JobKind.SPEECH, models=("test-sleep",),
                        sample_rate=16000, voices=OPENAI_VOICES)

    def speech(self, request, ctx):
        seconds = float(request.input) if request.input.replace(".", "", 1).isdigit() else 1
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if ctx.is_cancelled():
                raise JobCancelled("cancelled")
            time.sleep(0.05)
        yield AudioPiece(_tone(0.5), 16000)


@register_pipeline
class Stream(Pipeline):
    """Six quarter-second tone chunks, one every 0.3 s: audio worth streaming, slowly
    enough that a streaming client sees the first bytes long before the job ends."""

    spec = PipelineSpec(name="test-stream", kind=JobKind.SPEECH, models=("test-stream",),
                        sample_rate=16000, voices=OPENAI_VOICES)

    def speech(self, request, ctx):
        for i in range(6):
            time.sleep(0.3)
            if ctx.is_cancelled():
                raise JobCancelled("cancelled")
            ctx.report_progress((i + 1) / 6)
            yield AudioPiece(_tone(0.25), 16000)


@register_pipeline
class Fast(Pipeline):
    """About 0.2 s of work per job: high counts in little time for the chaos tests."""

    spec = PipelineSpec(name="test-fast", kind=JobKind.SPEECH, models=("test-fast",),
                        sample_rate=16000, voices=OPENAI_VOICES)

    def speech(self, request, ctx):
        for i in range(4):
            time.sleep(0.05)
            ctx.report_progress((i + 1) / 4)
        yield AudioPiece(_tone(0.5), 16000)


@register_pipeline
class Instant(Pipeline):
    """A tenth of a second of tone at once: a thousand jobs cost seconds (fair share)."""

    spec = PipelineSpec(name="test-instant", kind=JobKind.SPEECH, models=("test-instant",),
                        sample_rate=16000, voices=OPENAI_VOICES)

    def speech(self, request, ctx):
        yield AudioPiece(_tone(0.1), 16000)


@register_pipeline
class Paced(Pipeline):
    """A fixed 0.6 s of work per job: a queue whose drain an ETA can be checked against."""

    spec = PipelineSpec(name="test-paced", kind=JobKind.SPEECH, models=("test-paced",),
                        sample_rate=16000, voices=OPENAI_VOICES)

    def speech(self, request, ctx):
        time.sleep(0.6)
        yield AudioPiece(_tone(0.1), 16000)


@register_pipeline
class Stuck(Pipeline):
    """A call that hangs and never looks at cancellation (a wedged engine), on the attempts
    listed in the ``stuck_attempts_file`` option (one line per attempt seen so far)."""

    spec = PipelineSpec(name="test-stuck", kind=JobKind.SPEECH, models=("test-stuck",),
                        sample_rate=16000, voices=OPENAI_VOICES)

    def speech(self, request, ctx):
        from pathlib import Path

        seen = Path(self.options["stuck_attempts_file"])
        with seen.open("a") as f:
            f.write(ctx.job_id + "\n")
        if seen.read_text().splitlines().count(ctx.job_id) <= int(
                self.options.get("stuck_attempts", 1)):
            time.sleep(600)
        yield AudioPiece(_tone(0.5), 16000)


def _tone(seconds: float, rate: int = 16000) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


AFTER_GENERATE = None  # tests may set a callback run when a pipeline finishes generating


@register_pipeline
class CumulativeSnapshots(Pipeline):
    """Audex-style code2wav snapshots: growing, with empty and shorter late ones."""

    spec = PipelineSpec(name="test-snapshots", kind=JobKind.SPEECH, models=("test-snapshots",),
                        audio_mode="cumulative", sample_rate=16000, voices=OPENAI_VOICES)

    def speech(self, request, ctx):
        full = _tone(2.0)
        for piece in (full[:0], full[:8000], full[:24000], full, full[:0], full[:4000]):
            yield AudioPiece(piece, 16000)
        if AFTER_GENERATE is not None:
            AFTER_GENERATE()


@register_pipeline
class RateChange(Pipeline):
    spec = PipelineSpec(name="test-rate-change", kind=JobKind.SPEECH,
                        models=("test-rate-change",), sample_rate=16000, voices=OPENAI_VOICES)

    def speech(self, request, ctx):
        yield AudioPiece(_tone(0.5), 16000)
        yield AudioPiece(_tone(0.5, 24000), 24000)


@register_pipeline
class Flaky(Pipeline):
    """Raises a retryable engine error every time."""

    spec = PipelineSpec(name="test-flaky", kind=JobKind.SPEECH, models=("test-flaky",),
                        sample_rate=16000, voices=OPENAI_VOICES)

    def speech(self, request, ctx):
        from core.errors import PipelineFailed

        raise PipelineFailed("engine died (simulated)")
        yield  # pragma: no cover


@register_pipeline
class Buggy(Pipeline):
    """Raises an unexpected exception, as a bug would."""

    spec = PipelineSpec(name="test-buggy", kind=JobKind.SPEECH, models=("test-buggy",),
                        sample_rate=16000, voices=OPENAI_VOICES)

    def speech(self, request, ctx):
        raise KeyError("secret-internal-detail")
        yield  # pragma: no cover


def _clip(frames: int, height: int = 48, width: int = 64, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 255, (1, height, width, 3), dtype=np.uint8)
    return np.repeat(base, frames, axis=0) + np.arange(frames, dtype=np.uint8)[:, None, None, None]


def _stereo(seconds: float, rate: int = 16000) -> np.ndarray:
    mono = _tone(seconds, rate)
    return np.stack([mono, mono])


def _mp4(frames: int, fps: int, with_audio: bool, audio_share: float = 1.0,
         height: int = 48, width: int = 64, silent: bool = False) -> bytes:
    from media.audio import Audio
    from media.mux import mux_mp4

    track = _stereo(frames / fps * audio_share) * (0.0 if silent else 1.0)
    audio = Audio(track, 16000) if with_audio else None
    return mux_mp4(_clip(frames, height, width), fps, audio)


def _mpeg4(frames: int, fps: int) -> bytes:
    """An MP4 whose video is MPEG-4 Part 2, not H.264."""
    import io

    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        stream = out.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for i, rgb in enumerate(_clip(frames)):
            frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
            frame.pts = i
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return buf.getvalue()


def _defective(defect: str, req):
    """The T2VA output shapes real engines produce, each with one defect (or none)."""
    from pipelines import VideoResult

    f, n, secs = req.frames, req.n, req.frames / req.fps
    good = np.stack([_clip(f, seed=i) for i in range(n)])
    audio = np.stack([_stereo(secs) for _ in range(n)])
    res = VideoResult(fps=req.fps, videos=good, audio=audio, audio_sample_rate=16000)
    changes = {
        "fps-nan": dict(fps=float("nan")), "fps-zero": dict(fps=0.0),
        "fps-negative": dict(fps=-24.0), "fps-inf": dict(fps=float("inf")),
        "fps-23.976": dict(fps=23.976),
        "layout-fchw": dict(videos=good.transpose(0, 1, 4, 2, 3)),
        "layout-cfhw": dict(videos=list(good.transpose(0, 4, 1, 2, 3))),
        "layout-ambiguous": dict(videos=np.zeros((n, f, 3, 3, 3), np.uint8)),
        "odd-size": dict(videos=good[:, :, :47, :63]),
        "float-frames": dict(videos=good.astype(np.float32) / 255.0),
        "nan-frames": dict(videos=np.full(good.shape, np.nan, np.float32)),
        "frames-short": dict(videos=good[:, :-3]),
        "audio-1d": dict(audio=_tone(secs)),
        "audio-batch": dict(audio=np.stack([_stereo(secs)] * (n + 1))),
        "audio-list-short": dict(audio=[_stereo(secs)] * (n - 1)),
        "audio-3ch": dict(audio=[np.stack([_tone(secs)] * 3)] * n),
        "av-mismatch": dict(audio=np.stack([_stereo(secs * 2)] * n)),
        "no-audio": dict(audio=None),
        "silent-audio": dict(audio=np.zeros_like(audio)),
        "mp4": dict(videos=None, audio=[None] * n, mp4=[_mp4(f, req.fps, True)] * n),
        "mp4-no-audio": dict(videos=None, audio=[None] * n, mp4=[_mp4(f, req.fps, False)] * n),
        "mp4-half-audio": dict(videos=None, audio=[None] * n,
                               mp4=[_mp4(f, req.fps, True, audio_share=0.5)] * n),
        "mp4-wrong-size": dict(videos=None, audio=[None] * n,
                               mp4=[_mp4(f, req.fps, True, height=24, width=32)] * n),
        "mp4-short": dict(videos=None, audio=[None] * n, mp4=[_mp4(f - 4, req.fps, True)] * n),
        "mp4-silent": dict(videos=None, audio=[None] * n,
                           mp4=[_mp4(f, req.fps, True, silent=True)] * n),
        "mp4-mpeg4": dict(videos=None, audio=[None] * n, mp4=[_mpeg4(f, req.fps)] * n),
    }
    for key, value in changes.get(defect, {}).items():
        setattr(res, key, value)
    return res


@register_pipeline
class DefectiveVideo(Pipeline):
    """The prompt names the defect to produce ("ok" for none)."""

    spec = PipelineSpec(name="test-video", kind=JobKind.VIDEO, models=("test-video",),
                        video=VideoLimits(default_size="64x48", default_seconds=1.0,
                                          default_fps=24))

    def video(self, request, ctx):
        return _defective(request.prompt, request)


@register_pipeline
class SlowVideo(Pipeline):
    """Reports progress over about three seconds, to watch progress advance."""

    spec = PipelineSpec(name="test-video-slow", kind=JobKind.VIDEO,
                        models=("test-video-slow",),
                        video=VideoLimits(default_size="64x48", default_seconds=1.0,
                                          default_fps=24))

    def video(self, request, ctx):
        for step in range(1, 7):
            if ctx.is_cancelled():
                raise JobCancelled("cancelled")
            time.sleep(0.5)
            ctx.report_progress(step / 6)
        return _defective("ok", request)
