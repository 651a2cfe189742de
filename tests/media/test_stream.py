"""Stream every format in random-sized pieces, decode the joined bytes, and compare them
with the stored encoding of the same samples."""

from __future__ import annotations

import numpy as np
import pytest

from core.errors import InvalidRequest
from media.audio import Audio
from media.encode import FORMATS, encode_audio
from media.probe import AudioProbe, probe_audio
from media.stream import STREAMABLE, stream_encoder
from media.verify import PADDING_SAMPLES

SR = 22050
SECONDS = 1.5
# MP3 streams carry no Xing/LAME header, so decoders keep LAME's 576 samples of delay and
# their own 529, which the stored file's header trims; the end keeps up to a frame more.
MP3_DELAY = 1105
CODEC_FRAME = {"mp3": 1152, "aac": 1024, "opus": 960}
# Input rates and lengths: resampled (pcm, opus, mp3 at 22000 -> 22050) and not.
CASES = [(16000, 0.7, 1), (22000, 1.1, 2), (22050, SECONDS, 1), (22050, SECONDS, 2),
         (48000, 1.1, 2)]


def signal(channels: int, seconds: float = SECONDS, seed: int = 0, sr: int = SR
           ) -> np.ndarray:
    """A tone with noise on it, a different one per channel, as AudioAggregator returns."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(round(seconds * sr))) / sr
    rows = [amp * np.sin(2 * np.pi * hz * t) + 0.05 * rng.standard_normal(t.size)
            for hz, amp in [(440.0, 0.5), (660.0, 0.25)][:channels]]
    return np.stack(rows).astype(np.float32)


def random_pieces(samples: np.ndarray, seed: int) -> list[np.ndarray]:
    """Cut into pieces of 0 to 3000 frames; zero-length ones included on purpose."""
    rng = np.random.default_rng(seed)
    pieces, start = [samples[:, :0]], 0
    while start < samples.shape[1]:
        size = int(rng.choice([0, rng.integers(1, 3000)]))
        pieces.append(samples[:, start:start + size])
        start += size
    return pieces


def decode(data: bytes, fmt: str, rate: int, channels: int) -> AudioProbe:
    if fmt == "pcm":
        return probe_audio(data, container_format="s16le", raw_rate=rate,
                           raw_channels=channels)
    return probe_audio(data)


def test_streamable_formats_are_the_stored_formats() -> None:
    assert STREAMABLE == {"pcm", "wav", "mp3", "aac", "opus", "flac"} == set(FORMATS)


@pytest.mark.parametrize(("rate", "seconds", "channels"), CASES)
@pytest.mark.parametrize("fmt", sorted(STREAMABLE))
def test_joined_stream_decodes_like_the_stored_file(fmt: str, rate: int, seconds: float,
                                                    channels: int) -> None:
    samples = signal(channels, seconds, seed=channels, sr=rate)
    encoder = stream_encoder(fmt, rate, channels)
    pieces = random_pieces(samples, seed=len(fmt) + rate + channels)
    assert any(p.shape[1] == 0 for p in pieces)
    data = b"".join([encoder.add(p) for p in pieces] + [encoder.close()])

    assert encoder.content_type == FORMATS[fmt].content_type
    stored = encode_audio(Audio(samples=samples, sample_rate=rate), fmt)
    assert encoder.sample_rate == stored.sample_rate
    streamed = decode(data, fmt, encoder.sample_rate, channels)
    reference = decode(stored.data, fmt, stored.sample_rate, channels)
    assert (streamed.codec, streamed.sample_rate, streamed.channels) == (
        reference.codec, reference.sample_rate, reference.channels)

    # Same frames into the same encoder: no sample lost, doubled or clicked at a cut.
    start = MP3_DELAY if fmt == "mp3" else 0
    extra = streamed.frames - reference.frames - start
    assert abs(extra) <= CODEC_FRAME.get(fmt, 0)
    common = min(streamed.frames - start, reference.frames)
    np.testing.assert_allclose(streamed.samples[:, start:start + common],
                               reference.samples[:, :common], atol=1e-4)
    expected = seconds * encoder.sample_rate
    assert abs(streamed.frames - start - expected) <= PADDING_SAMPLES


@pytest.mark.parametrize("fmt", ["wav", "pcm"])
def test_lossless_streams_hold_the_input_samples(fmt: str) -> None:
    samples = signal(2, seed=3)
    encoder = stream_encoder(fmt, 24000, 2)  # 24 kHz: no resampling even for pcm
    data = b"".join([encoder.add(p) for p in random_pieces(samples, seed=4)]
                    + [encoder.close()])
    decoded = decode(data, fmt, 24000, 2)
    assert decoded.samples.shape == samples.shape
    np.testing.assert_allclose(decoded.samples, samples, atol=1.5 / 32768)


@pytest.mark.parametrize("fmt", sorted(STREAMABLE))
def test_bytes_leave_while_audio_is_added(fmt: str) -> None:
    samples = signal(1, seconds=2.0)
    encoder = stream_encoder(fmt, SR, 1)
    step = SR // 10
    first_second = [encoder.add(samples[:, i:i + step]) for i in range(0, SR, step)]
    assert b"".join(first_second), "nothing sent after 1 s of audio"
    rest = [encoder.add(samples[:, i:i + step]) for i in range(SR, samples.shape[1], step)]
    sent = len(b"".join(first_second + rest))
    tail = encoder.close()
    assert sent > 2 * len(tail), "most of the stream waited for close"


def test_wav_header_is_open_ended_and_comes_first() -> None:
    encoder = stream_encoder("wav", SR, 1)
    first = encoder.add(signal(1, seconds=0.1))
    assert first[:4] == b"RIFF" and first[8:12] == b"WAVE"
    assert first[4:8] == b"\xff\xff\xff\xff"
    data_at = first.index(b"data")
    assert first[data_at + 4:data_at + 8] == b"\xff\xff\xff\xff"
    assert encoder.close()


@pytest.mark.parametrize("fmt", sorted(STREAMABLE))
def test_stream_without_audio_closes_empty(fmt: str) -> None:
    encoder = stream_encoder(fmt, SR, 2)
    assert encoder.add(np.zeros((2, 0), dtype=np.float32)) == b""
    assert encoder.close() == b""


def test_unstreamable_format_is_an_invalid_request() -> None:
    with pytest.raises(InvalidRequest) as caught:
        stream_encoder("ogg-vorbis" * 10, SR, 1)
    assert caught.value.code == "unsupported_stream_format"
    assert caught.value.param == "response_format"
    assert "ogg-vorbis" * 10 not in caught.value.message  # echo clipped


def test_misuse_is_refused() -> None:
    encoder = stream_encoder("pcm", SR, 1)
    with pytest.raises(ValueError):
        encoder.add(signal(2, seconds=0.1))  # wrong channel count
    encoder.add(signal(1, seconds=0.1))
    encoder.close()
    with pytest.raises(ValueError):
        encoder.add(signal(1, seconds=0.1))
    with pytest.raises(ValueError):
        encoder.close()
    with pytest.raises(ValueError):
        stream_encoder("wav", SR, 3)
