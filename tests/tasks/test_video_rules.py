"""Every video assembly rule, through the real worker path: generate -> finalize."""

from __future__ import annotations

import hashlib

import pytest

from core.jobs import JobStatus
from media.probe import probe_video
from tasks import finalize as finalize_module
from tasks.render import run_job

from .test_render import app, outcome, rt, submit, tenant  # noqa: F401  (fixtures)

FAILS = {
    "fps-nan": "fps_invalid", "fps-zero": "fps_invalid", "fps-negative": "fps_invalid",
    "fps-inf": "fps_invalid", "layout-ambiguous": "video_layout_ambiguous",
    "nan-frames": "video_not_finite", "frames-short": "frame_count_mismatch",
    "audio-1d": "audio_pairing_mismatch", "audio-batch": "audio_pairing_mismatch",
    "audio-list-short": "audio_pairing_mismatch", "audio-3ch": "audio_channels_unsupported",
    "av-mismatch": "av_duration_mismatch", "no-audio": "no_audio",
    "silent-audio": "silent_audio", "mp4-no-audio": "audio_missing",
    "mp4-half-audio": "av_duration_mismatch", "mp4-wrong-size": "video_mismatch",
    "mp4-short": "frame_count_mismatch", "mp4-silent": "silent_audio",
    "mp4-mpeg4": "codec_mismatch",
}


def video_job(rt, tenant, defect, n=2, **extra):  # noqa: F811
    return submit(rt, tenant, "test-video", prompt=defect, seconds=1.0, size="64x48", fps=24,
                  n=n, generate_audio=True, **extra)


@pytest.mark.parametrize("defect", sorted(FAILS))
def test_defect_fails_the_job_with_its_reason(rt, app, tenant, defect):  # noqa: F811
    job = video_job(rt, tenant, defect, n=2)
    assert outcome(run_job(rt, app, job.id)) == "failed"
    failed = rt.jobs.get(job.id)
    assert failed.status is JobStatus.FAILED and failed.error_code == FAILS[defect]
    assert failed.error_message and failed.outputs == ()


def test_single_track_for_single_video_is_fine_but_not_for_two(rt, app, tenant):  # noqa: F811
    ok = video_job(rt, tenant, "audio-1d", n=1)
    # 1-D audio with one video: a mono track, accepted.
    assert outcome(run_job(rt, app, ok.id)) == "completed"
    bad = video_job(rt, tenant, "audio-1d", n=2)
    assert outcome(run_job(rt, app, bad.id)) == "failed"


@pytest.mark.parametrize("defect", ["ok", "fps-23.976", "layout-fchw", "layout-cfhw",
                                    "float-frames", "odd-size"])
def test_accepted_shapes_produce_h264_aac_mp4s(rt, app, tenant, defect):  # noqa: F811
    job = video_job(rt, tenant, defect)
    assert outcome(run_job(rt, app, job.id)) == "completed"
    done = rt.jobs.get(job.id)
    assert [o.index for o in done.outputs] == [0, 1]
    for out in done.outputs:
        probe = probe_video(rt.store.get(out.key))
        assert probe.video_codec == "h264" and probe.audio.codec == "aac"
        assert probe.frames == out.frames == 24 and round(probe.fps) == 24
        assert (out.width, out.height) == (64, 48)
        assert out.sample_rate == 16000 and out.channels == 2
        assert abs(probe.duration_s - probe.audio.duration_s) <= 1 / 24 + 2048 / 16000 + 0.05
    a, b = (rt.store.get(o.key) for o in done.outputs)
    assert a != b  # each of n videos is its own clip


def test_video_without_audio_is_silent_and_says_so(rt, app, tenant):  # noqa: F811
    job = submit(rt, tenant, "test-video", prompt="ok", seconds=1.0, size="64x48", fps=24, n=1,
                 generate_audio=False)
    assert outcome(run_job(rt, app, job.id)) == "completed"
    [out] = rt.jobs.get(job.id).outputs
    assert out.sample_rate is None and out.channels is None
    assert probe_video(rt.store.get(out.key)).audio is None


def test_preencoded_mp4_is_uploaded_as_is_with_its_audio(rt, app, tenant):  # noqa: F811
    from tests.fake_pipelines import _mp4

    job = video_job(rt, tenant, "mp4", n=1)
    assert outcome(run_job(rt, app, job.id)) == "completed"
    [out] = rt.jobs.get(job.id).outputs
    stored = rt.store.get(out.key)
    assert hashlib.sha256(stored).hexdigest() == out.sha256
    assert stored == _mp4(24, 24, True)  # not re-muxed: byte for byte what the engine made
    assert out.sample_rate == 16000  # never reported silent


def test_mux_that_loses_audio_fails_the_job(rt, app, tenant, monkeypatch):  # noqa: F811
    real = finalize_module.mux_mp4
    monkeypatch.setattr(finalize_module, "mux_mp4", lambda f, fps, audio: real(f, fps, None))
    job = video_job(rt, tenant, "ok", n=1)
    assert outcome(run_job(rt, app, job.id)) == "failed"
    assert rt.jobs.get(job.id).error_code == "audio_missing"


@pytest.mark.parametrize("prompt", ["ok", "mp4"])
def test_each_video_gets_a_verified_thumbnail_and_spritesheet(rt, app, tenant, prompt):  # noqa: F811
    """Muxed here or pre-encoded by the engine: previews are rows beside each video."""
    from media.preview import decode_image

    job = video_job(rt, tenant, prompt, n=1)
    assert outcome(run_job(rt, app, job.id)) == "completed"
    done = rt.jobs.get(job.id)
    [video] = done.outputs  # the previews are not outputs of their own
    assert sorted(p.variant for p in done.previews) == ["spritesheet", "thumbnail"]
    for p in done.previews:
        data = rt.store.get(p.key)
        assert p.index == 0 and p.content_type == "image/webp"
        assert hashlib.sha256(data).hexdigest() == p.sha256 and len(data) == p.bytes
        assert p.key.startswith(video.key.rsplit("/", 1)[0])  # the attempt's own keys
        assert decode_image(data).shape == (p.height, p.width, 3)
    thumb = next(p for p in done.previews if p.variant == "thumbnail")
    assert (thumb.width, thumb.height) == (video.width, video.height)


def test_a_preview_that_fails_its_check_fails_the_job(rt, app, tenant, monkeypatch):  # noqa: F811
    from core.errors import EncodingFailed

    def broken(_mp4):
        raise EncodingFailed("preview differs from its frames", code="preview_mismatch")
    monkeypatch.setitem(finalize_module.PREVIEW_MAKERS, "spritesheet", broken)
    job = video_job(rt, tenant, "ok", n=1)
    assert outcome(run_job(rt, app, job.id)) == "failed"
    assert rt.jobs.get(job.id).error_code == "preview_mismatch"
