"""Test-only pipelines for the batch tests (OMNIJOBS_PIPELINE_MODULES of their stack)."""

from __future__ import annotations

import numpy as np

from core.jobs import JobKind
from pipelines import Pipeline, PipelineSpec, register_pipeline
from pipelines.base import OPENAI_VOICES, AudioPiece


@register_pipeline
class LaneTone(Pipeline):
    """A quarter second of tone, quickly: only the fair-lane test's own worker serves it."""

    spec = PipelineSpec(name="test-lane", kind=JobKind.SPEECH, models=("test-lane",),
                        sample_rate=16000, voices=OPENAI_VOICES)

    def speech(self, request, ctx):
        t = np.arange(4000) / 16000
        yield AudioPiece((0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), 16000)
