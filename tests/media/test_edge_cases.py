"""Edge cases found in review: each failed before its fix."""

from __future__ import annotations

import numpy as np
import pytest

from core.errors import EncodingFailed, OutputInvalid
from media.audio import Audio, AudioAggregator, to_channel_first
from media.encode import FORMATS, encode_audio
from media.probe import probe_audio
from media.validate import AudioBounds, validate_audio
from media.verify import verify_encoded_audio


@pytest.mark.parametrize("mode", ["incremental", "cumulative"])
def test_aggregator_copies_reused_buffers(mode):
    buf = np.empty(4, np.float32)
    agg = AudioAggregator(mode)
    buf[:] = 0.25
    agg.add(buf, 16000)
    buf[:] = 0.5
    if mode == "incremental":
        agg.add(buf, 16000)
        expected = [0.25] * 4 + [0.5] * 4
    else:
        expected = [0.25] * 4
    assert agg.result().samples[0].tolist() == expected


@pytest.mark.parametrize("shape", [(5, 0), (0, 2), (0, 1), (0,)])
def test_empty_payloads_of_any_layout_are_ignored(shape):
    agg = AudioAggregator("incremental")
    agg.add(np.zeros(shape, np.float32), 16000)
    agg.add(np.full(10, 0.1, np.float32), 16000)
    assert agg.channels == 1 and agg.frames == 10


@pytest.mark.parametrize("rate", [0, -16000, float("nan")])
def test_invalid_sample_rate_is_rejected(rate):
    with pytest.raises(OutputInvalid) as err:
        AudioAggregator("incremental").add(np.ones(10, np.float32), rate)
    assert err.value.code == "sample_rate_invalid"
    with pytest.raises(OutputInvalid):
        validate_audio(Audio(np.ones((1, 100), np.float32), 0), expected_sample_rate=None,
                       bounds=AudioBounds())


def test_uint8_is_offset_binary():
    assert to_channel_first(np.array([0, 128, 255], np.uint8))[0].tolist() == pytest.approx(
        [-1.0, 0.0, 127 / 128])


def test_short_aac_probes_with_its_demuxer():
    t = np.arange(400) / 8000
    enc = encode_audio(Audio((0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)[None],
                             8000), "aac")
    probe = probe_audio(enc.data, container_format=FORMATS["aac"].demuxer)
    assert probe.codec == "aac" and probe.frames >= 400


def test_codec_mismatch_is_caught():
    t = np.arange(8000) / 8000
    audio = Audio((0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)[None], 8000)
    probe = probe_audio(encode_audio(audio, "flac").data)
    with pytest.raises(EncodingFailed) as err:
        verify_encoded_audio(probe, sample_rate=8000, channels=1, duration_s=1.0,
                             silence_rms=1e-3, codecs=FORMATS["mp3"].decoders)
    assert err.value.code == "codec_mismatch"


def test_fps_error_echo_is_clipped():
    from media.video import coerce_fps

    with pytest.raises(OutputInvalid) as err:
        coerce_fps("x" * 200)
    assert "x" * 33 not in err.value.message


def test_wide_integer_frames_keep_their_values_or_are_rejected():
    from media.video import to_fhwc

    assert np.unique(to_fhwc(np.full((2, 4, 4, 3), 128, np.int64))).tolist() == [128]
    with pytest.raises(OutputInvalid) as err:
        to_fhwc(np.full((2, 4, 4, 3), 4000, np.uint16))
    assert err.value.code == "video_pixel_range"


@pytest.mark.parametrize("rate", [float("nan"), 0, -1, 22050.5, "abc"])
def test_bad_audio_rates_for_video_are_typed_errors(rate):
    from media.video import check_sync

    with pytest.raises(OutputInvalid) as err:
        check_sync(48, 24, 10, rate)
    assert err.value.code == "sample_rate_invalid"
    with pytest.raises(OutputInvalid):
        check_sync(48, 0, None, None)
