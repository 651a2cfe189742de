"""Encode every response format for real, decode it again, and check what survived."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest

from core.errors import EncodingFailed
from media.audio import Audio
from media.encode import FORMATS, EncodedAudio, encode_audio, target_rate
from media.probe import AudioProbe, probe_audio
from media.validate import DEFAULT_SILENCE_RMS, rms
from media.verify import PADDING_SAMPLES, SLACK_S, verify_encoded_audio

SR = 22050
SECONDS = 1.5
# (frequency, amplitude) per channel: distinct so a swapped or mixed channel is caught.
TONES = {1: [(440.0, 0.5)], 2: [(440.0, 0.5), (660.0, 0.25)]}
DECODERS = {
    "mp3": {"mp3float", "mp3"},
    "opus": {"opus", "libopus"},
    "aac": {"aac"},
    "flac": {"flac"},
    "wav": {"pcm_s16le"},
    "pcm": {"pcm_s16le"},
}
RATES = {"opus": 48000, "pcm": 24000}


def tone_audio(channels: int, *, sr: int = SR, seconds: float = SECONDS) -> Audio:
    t = np.arange(int(round(seconds * sr)), dtype=np.float64) / sr
    rows = [amp * np.sin(2 * np.pi * freq * t) for freq, amp in TONES[channels]]
    return Audio(samples=np.stack(rows).astype(np.float32), sample_rate=sr)


def probe_encoded(encoded: EncodedAudio) -> AudioProbe:
    if encoded.format.name == "pcm":
        return probe_audio(encoded.data, container_format="s16le",
                           raw_rate=encoded.sample_rate, raw_channels=encoded.channels)
    return probe_audio(encoded.data)


def dominant_hz(x: np.ndarray, sr: int) -> float:
    x = x.astype(np.float64) * np.hanning(x.size)
    spectrum = np.abs(np.fft.rfft(x))
    return float(np.fft.rfftfreq(x.size, 1.0 / sr)[int(np.argmax(spectrum))])


def test_formats_are_the_openai_set() -> None:
    assert set(FORMATS) == set(DECODERS)


@pytest.mark.parametrize("channels", [1, 2])
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_round_trip_keeps_the_audio(fmt: str, channels: int) -> None:
    source = tone_audio(channels)
    encoded = encode_audio(source, fmt)

    assert encoded.format is FORMATS[fmt]
    assert encoded.channels == channels
    assert encoded.sample_rate == RATES.get(fmt, SR)
    assert len(encoded.data) > 1000

    probe = probe_encoded(encoded)
    assert probe.codec in DECODERS[fmt]
    assert probe.sample_rate == encoded.sample_rate
    assert probe.channels == channels
    assert probe.samples.shape == (channels, probe.frames)
    assert probe.samples.dtype == np.float32
    tolerance = PADDING_SAMPLES / probe.sample_rate + SLACK_S
    assert abs(probe.duration_s - SECONDS) <= tolerance

    for ch, (freq, amp) in enumerate(TONES[channels]):
        decoded = probe.samples[ch]
        source_rms = rms(source.samples[ch])
        assert source_rms == pytest.approx(amp / np.sqrt(2), rel=1e-3)
        assert rms(decoded) == pytest.approx(source_rms, rel=0.15)
        assert abs(dominant_hz(decoded, probe.sample_rate) - freq) < 3.0

    # and the service's own check accepts it
    verify_encoded_audio(probe, sample_rate=encoded.sample_rate, channels=channels,
                         duration_s=source.duration_s, silence_rms=DEFAULT_SILENCE_RMS)


@pytest.mark.parametrize("channels", [1, 2])
def test_pcm_is_raw_s16le_at_24k(channels: int) -> None:
    encoded = encode_audio(tone_audio(channels), "pcm")
    frames = int(round(SECONDS * 24000))
    assert len(encoded.data) == frames * 2 * channels  # no header, 2 bytes per sample
    raw = np.frombuffer(encoded.data, dtype="<i2").reshape(-1, channels).T
    assert rms(raw[0].astype(np.float64) / 32768) == pytest.approx(0.5 / np.sqrt(2), rel=0.02)


@pytest.mark.parametrize(("fmt", "magic"), [("wav", b"RIFF"), ("flac", b"fLaC"),
                                            ("opus", b"OggS")])
def test_container_signatures(fmt: str, magic: bytes) -> None:
    assert encode_audio(tone_audio(1, seconds=0.2), fmt).data.startswith(magic)


def test_out_of_range_samples_are_clipped_not_wrapped() -> None:
    t = np.arange(SR // 2, dtype=np.float64) / SR
    loud = (1.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    probe = probe_encoded(encode_audio(Audio(samples=loud[np.newaxis], sample_rate=SR), "wav"))
    decoded = probe.samples[0]
    assert np.abs(decoded).max() <= 1.0
    strong = np.abs(loud) > 0.1
    assert np.array_equal(np.sign(decoded[strong]), np.sign(loud[strong]))  # no wrap-around
    assert np.abs(decoded).max() > 0.99


@pytest.mark.parametrize(("fmt", "native", "expected"), [
    ("mp3", 22050, 22050), ("mp3", 7000, 8000), ("mp3", 96000, 48000),
    ("aac", 16000, 16000), ("aac", 20000, 22050),
    ("opus", 16000, 48000), ("pcm", 16000, 24000),
    ("flac", 12345, 12345), ("wav", 96000, 96000),
])
def test_target_rate(fmt: str, native: int, expected: int) -> None:
    assert target_rate(FORMATS[fmt], native) == expected


def test_resampled_encoding_keeps_pitch() -> None:
    source = tone_audio(1, sr=16000, seconds=1.0)
    encoded = encode_audio(source, "opus")
    probe = probe_encoded(encoded)
    assert probe.sample_rate == 48000
    assert abs(probe.duration_s - 1.0) <= PADDING_SAMPLES / 48000 + SLACK_S
    assert abs(dominant_hz(probe.samples[0], 48000) - 440.0) < 3.0


# ---- verify_encoded_audio ------------------------------------------------------------

@pytest.fixture(scope="module")
def wav_probe() -> AudioProbe:
    probe = probe_encoded(encode_audio(tone_audio(1), "wav"))
    verify_encoded_audio(probe, sample_rate=SR, channels=1, duration_s=SECONDS,
                         silence_rms=DEFAULT_SILENCE_RMS)  # baseline: correct inputs pass
    return probe


def test_verify_rejects_wrong_sample_rate(wav_probe: AudioProbe) -> None:
    with pytest.raises(EncodingFailed):
        verify_encoded_audio(wav_probe, sample_rate=24000, channels=1, duration_s=SECONDS,
                             silence_rms=DEFAULT_SILENCE_RMS)


def test_verify_rejects_wrong_channel_count(wav_probe: AudioProbe) -> None:
    with pytest.raises(EncodingFailed):
        verify_encoded_audio(wav_probe, sample_rate=SR, channels=2, duration_s=SECONDS,
                             silence_rms=DEFAULT_SILENCE_RMS)


@pytest.mark.parametrize("expected_s", [SECONDS + 1.0, SECONDS - 1.0, 60.0])
def test_verify_rejects_duration_far_off(wav_probe: AudioProbe, expected_s: float) -> None:
    with pytest.raises(EncodingFailed) as info:
        verify_encoded_audio(wav_probe, sample_rate=SR, channels=1, duration_s=expected_s,
                             silence_rms=DEFAULT_SILENCE_RMS)
    assert info.value.code == "duration_mismatch"


def test_verify_duration_tolerance_edges(wav_probe: AudioProbe) -> None:
    tolerance = PADDING_SAMPLES / SR + SLACK_S
    verify_encoded_audio(wav_probe, sample_rate=SR, channels=1,
                         duration_s=wav_probe.duration_s + 0.9 * tolerance,
                         silence_rms=DEFAULT_SILENCE_RMS)
    with pytest.raises(EncodingFailed) as info:
        verify_encoded_audio(wav_probe, sample_rate=SR, channels=1,
                             duration_s=wav_probe.duration_s + 1.1 * tolerance,
                             silence_rms=DEFAULT_SILENCE_RMS)
    assert info.value.code == "duration_mismatch"


@pytest.mark.parametrize("fmt", ["wav", "mp3"])
def test_verify_rejects_silent_encoding(fmt: str) -> None:
    silent = Audio(samples=np.zeros((1, SR), dtype=np.float32), sample_rate=SR)
    encoded = encode_audio(silent, fmt)
    probe = probe_encoded(encoded)
    assert probe.frames > 0  # it decodes; it is just silent
    with pytest.raises(EncodingFailed) as info:
        verify_encoded_audio(probe, sample_rate=encoded.sample_rate, channels=1,
                             duration_s=1.0, silence_rms=DEFAULT_SILENCE_RMS)
    assert info.value.code == "silent_audio"


# ---- probe_audio on broken input ------------------------------------------------------

@pytest.mark.parametrize("data", [b"", b"this is not audio at all " * 40,
                                  bytes(range(256)) * 16, b"RIFF" + b"\x00" * 200])
def test_probe_of_garbage_raises_encoding_failed(data: bytes) -> None:
    with pytest.raises(EncodingFailed) as info:
        probe_audio(data)
    assert info.value.code == "encoding_failed"


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_truncated_encoding_is_caught(fmt: str) -> None:
    """Cut to a third: either the probe refuses it or the duration check does."""
    encoded = encode_audio(tone_audio(1), fmt)
    cut = encoded.data[: len(encoded.data) // 3]
    with pytest.raises(EncodingFailed):
        probe = probe_encoded(EncodedAudio(data=cut, format=encoded.format,
                                           sample_rate=encoded.sample_rate, channels=1))
        verify_encoded_audio(probe, sample_rate=encoded.sample_rate, channels=1,
                             duration_s=SECONDS, silence_rms=DEFAULT_SILENCE_RMS)


@pytest.mark.parametrize("fmt", ["wav", "pcm"])
def test_truncated_pcm_is_a_duration_mismatch(fmt: str) -> None:
    encoded = encode_audio(tone_audio(1), fmt)
    cut = encoded.data[: len(encoded.data) // 3 // 2 * 2]
    probe = probe_encoded(EncodedAudio(data=cut, format=encoded.format,
                                       sample_rate=encoded.sample_rate, channels=1))
    assert probe.duration_s < SECONDS / 2
    with pytest.raises(EncodingFailed) as info:
        verify_encoded_audio(probe, sample_rate=encoded.sample_rate, channels=1,
                             duration_s=SECONDS, silence_rms=DEFAULT_SILENCE_RMS)
    assert info.value.code == "duration_mismatch"


def video_only_mp4() -> bytes:
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=10)
        stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
        for i in range(3):
            frame = av.VideoFrame.from_ndarray(np.full((32, 32, 3), 40 * i, dtype=np.uint8),
                                               format="rgb24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return buf.getvalue()


def test_container_without_audio_is_audio_missing() -> None:
    data = video_only_mp4()
    with av.open(io.BytesIO(data)) as container:  # the fixture really is a video file
        assert len(container.streams.video) == 1
        assert len(container.streams.audio) == 0
    with pytest.raises(EncodingFailed) as info:
        probe_audio(data)
    assert info.value.code == "audio_missing"


# ---- the WAV fast path ------------------------------------------------------------------

def test_wav_probe_reads_what_ffmpeg_reads(monkeypatch) -> None:
    """The standard-library reader (finalize's WAV check, which opens no container)
    agrees with FFmpeg's decode."""
    import media.probe

    encoded = encode_audio(tone_audio(1), "wav")
    slow = probe_audio(encoded.data)  # no format given: FFmpeg probes and decodes
    monkeypatch.setattr(media.probe, "_open", lambda *_a: pytest.fail("opened FFmpeg"))
    fast = probe_audio(encoded.data, container_format="wav")
    assert (fast.codec, fast.sample_rate, fast.channels, fast.frames) == (
        slow.codec, slow.sample_rate, slow.channels, slow.frames)
    assert np.allclose(fast.samples, slow.samples, atol=1e-6)


def test_wav_whose_header_disagrees_with_its_data_is_left_to_ffmpeg() -> None:
    """A WAV cut short keeps a header that promises more frames: the fast path declines
    and the probe reports the frames really there (then the duration check fails it)."""
    encoded = encode_audio(tone_audio(1), "wav")
    cut = encoded.data[: len(encoded.data) // 3 // 2 * 2]
    probe = probe_audio(cut, container_format="wav")
    assert 0 < probe.duration_s < SECONDS / 2
    with pytest.raises(EncodingFailed):
        probe_audio(b"RIFF" + b"\x00" * 200, container_format="wav")
