"""Test-only pipelines, imported by the worker through OMNIJOBS_PIPELINE_MODULES."""

from __future__ import annotations

import numpy as np

from omnijobs.core.jobs import JobKind
from omnijobs.pipelines import Pipeline, PipelineSpec, register_pipeline
from omnijobs.pipelines.base import OPENAI_VOICES, AudioPiece


@register_pipeline
class SilentSpeech(Pipeline):
    """Produces a second of digital silence: the service must call that a failure."""

    spec = PipelineSpec(name="test-silent", kind=JobKind.SPEECH, models=("test-silent",),
                        sample_rate=16000, voices=OPENAI_VOICES)

    def speech(self, request, ctx):
        yield AudioPiece(np.zeros(16000, dtype=np.float32), 16000)


@register_pipeline
class SlowTone(Pipeline):
    """A tone produced slowly, one chunk per 0.5 s: long enough to kill a worker mid-job."""

    spec = PipelineSpec(name="test-slow", kind=JobKind.SPEECH, models=("test-slow",),
                        sample_rate=16000, voices=OPENAI_VOICES)

    def speech(self, request, ctx):
        import time

        t = np.arange(8000) / 16000
        for i in range(8):
            time.sleep(0.5)
            ctx.report_progress((i + 1) / 8)
            yield AudioPiece((0.3 * np.sin(2 * np.pi * 330 * t)).astype(np.float32), 16000)


def _tone(seconds: float, rate: int = 16000) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


@register_pipeline
class CumulativeSnapshots(Pipeline):
    """Audex-style code2wav snapshots: growing, with empty and shorter late ones."""

    spec = PipelineSpec(name="test-snapshots", kind=JobKind.SPEECH, models=("test-snapshots",),
                        audio_mode="cumulative", sample_rate=16000, voices=OPENAI_VOICES)

    def speech(self, request, ctx):
        full = _tone(2.0)
        for piece in (full[:0], full[:8000], full[:24000], full, full[:0], full[:4000]):
            yield AudioPiece(piece, 16000)


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
        from omnijobs.core.errors import PipelineFailed

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
