"""The CPU reference speech pipeline runs the real Piper voice."""

from __future__ import annotations

import pytest

from core.errors import JobCancelled
from media.audio import AudioAggregator
from media.validate import AudioBounds, validate_audio
from pipelines import RunContext, SpeechRequest
from pipelines.piper_tts import PiperJoe

TEXT = "The first sentence is here. The second one follows. And a third."


@pytest.fixture(scope="module")
def piper() -> PiperJoe:
    p = PiperJoe()
    p.load()
    return p


def synth(piper, speed=1.0, **ctx):
    agg = AudioAggregator(PiperJoe.spec.audio_mode)
    pieces = list(piper.speech(SpeechRequest(input=TEXT, speed=speed),
                               RunContext(job_id="t", **ctx)))
    for piece in pieces:
        agg.add(piece.samples, piece.sample_rate)
    return pieces, agg.result()


def test_one_chunk_per_sentence_at_declared_rate(piper):
    progress = []
    pieces, audio = synth(piper, report_progress=progress.append)
    assert len(pieces) == 3
    assert {p.sample_rate for p in pieces} == {PiperJoe.spec.sample_rate}
    assert audio.frames == sum(len(p.samples) for p in pieces)
    assert progress[-1] == pytest.approx(1.0) and progress == sorted(progress)
    stats = validate_audio(audio, expected_sample_rate=22050, bounds=AudioBounds())
    assert 2.0 < stats.duration_s < 8.0 and stats.rms > 0.02


def test_speed_changes_duration(piper):
    _, normal = synth(piper)
    _, fast = synth(piper, speed=2.0)
    _, slow = synth(piper, speed=0.5)
    # Piper stretches phonemes, not the pauses between sentences: not an exact 2x.
    assert fast.duration_s < 0.8 * normal.duration_s
    assert slow.duration_s > 1.4 * normal.duration_s


def test_cancellation_stops_between_sentences(piper):
    gen = piper.speech(SpeechRequest(input=TEXT), RunContext(job_id="t",
                                                             is_cancelled=lambda: True))
    with pytest.raises(JobCancelled):
        next(gen)


@pytest.mark.parametrize(("text", "speaks"), [
    (" ", False), (".", False), ("...", False), ("?!", False), ("( )", False),
    ("\u200b", False), ("--", False), ("$", True), ("7", True), ("a.", True), ("中", True),
    ("é", True)])
def test_submit_refuses_exactly_what_piper_would_not_speak(piper, text, speaks):
    """The API's rule (a letter, digit or symbol) against the real voice, on both sides
    of it: what it refuses would have failed with no_audio, what it takes is spoken."""
    from core.errors import InvalidRequest

    try:
        PiperJoe.spec.validate_speech(SpeechRequest(input=text))
        accepted = True
    except InvalidRequest as exc:
        assert exc.code == "empty_input" and exc.param == "input"
        accepted = False
    frames = sum(len(p.samples) for p in piper.speech(SpeechRequest(input=text),
                                                      RunContext(job_id="t")))
    assert (accepted, frames > 0) == (speaks, speaks)
