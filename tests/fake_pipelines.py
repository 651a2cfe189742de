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
