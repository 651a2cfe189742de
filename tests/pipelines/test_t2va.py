"""MiniMax-H3-class T2VA through vLLM-Omni, against the fake engine."""

from __future__ import annotations

import pytest

from core.errors import InvalidRequest
from media.probe import probe_video
from pipelines import RunContext, VideoRequest, get_spec, import_pipeline_modules
from pipelines.t2va import MiniMaxH3
from tasks.render import run_job

from ..tasks.test_render import app, outcome, rt, submit, tenant  # noqa: F401  (fixtures)

FAKE = {"engine_factory": "tests.fake_omni:make_engine"}

import_pipeline_modules()


def request(**kw) -> VideoRequest:
    base = dict(prompt="A heron lifts off a misty lake.", seconds=2.0, width=448, height=256,
                fps=24, n=2, seed=11, negative_prompt="blurry", guidance_scale=5.5)
    return VideoRequest(**{**base, **kw})


def test_request_maps_to_prompt_and_copied_diffusion_params():
    pipeline = MiniMaxH3(FAKE)
    pipeline.load()
    engine = pipeline._bridge.engine
    result = pipeline.video(request(), RunContext("video_1"))
    sent = engine.requests[-1]
    assert sent["prompt"] == {"prompt": "A heron lifts off a misty lake.",
                              "modalities": ["video"], "negative_prompt": "blurry"}
    gp = sent["params"][1]
    assert (gp.width, gp.height, gp.num_frames, gp.fps) == (448, 256, 48, 24)
    assert (gp.seed, gp.num_outputs_per_prompt, gp.guidance_scale) == (11, 2, 5.5)
    assert gp.extra_args == {"duration": 2.0, "generate_sound": True}
    defaults = engine.default_sampling_params_list[1]
    assert (defaults.width, defaults.num_outputs_per_prompt, defaults.extra_args) == (
        1280, 1, {})
    assert len(result.videos) == 2 and result.videos[0].shape == (48, 256, 448, 3)
    assert result.audio.shape[:2] == (2, 2) and result.audio_sample_rate == 32000
    assert result.fps == 24.0


def test_preencoded_mode_returns_mp4_bytes_with_no_audio_arrays():
    pipeline = MiniMaxH3({**FAKE, "preencode_mp4": True})
    pipeline.load()
    result = pipeline.video(request(n=1), RunContext("video_2"))
    assert result.videos is None and result.audio == [None]
    assert result.mp4[0][4:8] == b"ftyp"
    assert pipeline._bridge.engine.requests[-1]["params"][1].extra_args["preencode_mp4"]


@pytest.mark.parametrize("size", ["448x256", "1280x720", "1024x1024", "720x1280"])
def test_supported_aspect_ratios(size):
    w, h = (int(v) for v in size.split("x"))
    get_spec("minimax-h3").validate_video(request(width=w, height=h))


def test_unsupported_aspect_ratio_is_rejected():
    with pytest.raises(InvalidRequest) as err:
        get_spec("minimax-h3").validate_video(request(width=1000, height=200))
    assert err.value.param == "size"


@pytest.fixture
def h3_rt(rt):  # noqa: F811
    rt.settings.pipelines = [*rt.settings.pipelines, "minimax-h3"]
    rt.settings.pipeline_options = {"minimax-h3": FAKE}
    return rt


@pytest.mark.parametrize("preencode", [False, True])
def test_t2va_job_through_the_worker(h3_rt, app, tenant, preencode):  # noqa: F811
    h3_rt.settings.pipeline_options = {"minimax-h3": {**FAKE, "preencode_mp4": preencode}}
    job = submit(h3_rt, tenant, "minimax-h3", prompt="Fireworks over a harbour.", seconds=1.0,
                 size="448x256", fps=24, n=2, generate_audio=True)
    assert outcome(run_job(h3_rt, app, job.id)) == "completed"
    outputs = h3_rt.jobs.get(job.id).outputs
    assert len(outputs) == 2
    for out in outputs:
        probe = probe_video(h3_rt.store.get(out.key))
        assert probe.video_codec == "h264" and probe.audio.codec == "aac"
        assert probe.frames == 24 and out.sample_rate == 32000 and out.channels == 2
