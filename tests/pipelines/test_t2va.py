"""MiniMax-H3 T2VA through vLLM-Omni, against a fake engine that runs H3's own request
checks (``resolve_minimax_h3_shape``,
model_executor/models/minimax_h3/encoder_processing.py:145-211)."""

from __future__ import annotations

import io

import av
import pytest

from core.errors import InvalidRequest
from media.probe import probe_video
from pipelines import RunContext, VideoRequest, get_spec, import_pipeline_modules
from pipelines.t2va import H3_RATIOS, MiniMaxH3
from tasks.render import run_job
from tests import fake_omni
from tests import omni_source as src

from ..tasks.test_render import app, outcome, rt, submit, tenant  # noqa: F401  (fixtures)

FAKE = {"engine_factory": "tests.fake_omni:make_engine"}

import_pipeline_modules()


def request(**kw) -> VideoRequest:
    base = dict(prompt="A heron lifts off a misty lake.", seconds=4.0, width=448, height=256,
                fps=24, n=2, seed=11, negative_prompt="blurry", guidance_scale=5.5)
    return VideoRequest(**{**base, **kw})


@pytest.fixture(scope="module")
def h3():
    pipeline = MiniMaxH3(FAKE)
    pipeline.load()  # the warm-up is a request the strict engine must accept
    return pipeline


def test_constants_match_vllm_omni():
    """Copied because the API must validate without vllm-omni (and its modules need torch)."""
    consts = {**src.constants("model_executor/models/minimax_h3/preprocessing.py"),
              **src.constants("model_executor/models/minimax_h3/encoder_processing.py")}
    assert {f"{w}:{h}" for w, h in H3_RATIOS} == set(consts["MINIMAX_H3_SUPPORTED_ASPECT_RATIOS"])
    lim = get_spec("minimax-h3").video
    assert (lim.min_seconds, lim.max_seconds) == (consts["MINIMAX_H3_MIN_OUTPUT_SECONDS"],
                                                  consts["MINIMAX_H3_MAX_OUTPUT_SECONDS"])
    assert lim.fixed_fps == consts["MINIMAX_H3_FPS"]
    align = src.function("diffusion/models/minimax_h3/time_request.py", "_align_frame_count")
    for seconds in (4.0, 5.0, 7.3, 12.0, 15.0):
        for size in ((1280, 720), (448, 256), (720, 1280), (1000, 1000)):
            req = request(seconds=seconds, width=size[0], height=size[1])
            assert lim.rendered(req) == (align(round(seconds * 24)), size[0] // 32 * 32,
                                         size[1] // 32 * 32)


def test_request_maps_to_prompt_and_copied_diffusion_params(h3):
    engine = h3._bridge.engine
    result = h3.video(request(), RunContext("video_1"))
    sent = engine.requests[-1]
    assert sent["prompt"] == {"prompt": "A heron lifts off a misty lake.",
                              "modalities": ["video"], "negative_prompt": "blurry"}
    gp = sent["params"][1]
    assert (gp.width, gp.height, gp.fps) == (448, 256, 24)
    assert (gp.seed, gp.num_outputs_per_prompt, gp.guidance_scale) == (11, 2, 5.5)
    assert gp.extra_args["duration"] == 4.0 and gp.extra_args["aspect_ratio"] == "16:9"
    assert gp.num_inference_steps == 50  # the deploy yaml's default survives
    defaults = engine.default_sampling_params_list[1]
    assert (defaults.width, defaults.seed, defaults.extra_args) == (None, 42, {})
    # 96 frames asked, the engine's 17n+5 grid makes 107
    assert len(result.videos) == 2 and result.videos[0].shape == (107, 256, 448, 3)
    assert result.audio.shape[:2] == (2, 2) and result.audio_sample_rate == 32000
    assert result.fps == 24.0


def sent_params(req: VideoRequest):
    """The diffusion params a request becomes, from the deploy's real defaults."""
    from pipelines.t2va import apply_request

    gp = fake_omni.default_params("minimax_h3_disaggregated.yaml")[1]
    apply_request(gp, req, preencode=False)
    return gp


@pytest.mark.parametrize(("size", "ratio"), [
    ("1792x768", "21:9"), ("1280x720", "16:9"), ("1024x768", "4:3"), ("512x512", "1:1"),
    ("768x1024", "3:4"), ("720x1280", "9:16"), ("1024x1792", "9:16")])
def test_every_supported_size_sends_its_named_aspect_ratio(size, ratio):
    w, h = (int(v) for v in size.split("x"))
    req = request(width=w, height=h, n=1)
    get_spec("minimax-h3").validate_video(req)
    gp = sent_params(req)
    assert gp.extra_args["aspect_ratio"] == ratio
    height, width, frames, *_ = fake_omni.h3_shape("t2va", gp, None)  # the engine accepts it
    assert (frames, width, height) == get_spec("minimax-h3").video.rendered(req)


@pytest.mark.parametrize(("fields", "param"), [
    ({"seconds": 3.9}, "seconds"), ({"seconds": 15.5}, "seconds"), ({"seconds": 1.0}, "seconds"),
    ({"fps": 30}, "fps"), ({"fps": 25}, "fps"), ({"fps": 60}, "fps"),
    ({"width": 1000, "height": 200}, "size"), ({"width": 30, "height": 30}, "size"),
    ({"width": 16, "height": 16}, "size")])
def test_contract_rejections_at_submit(fields, param):
    with pytest.raises(InvalidRequest) as err:
        get_spec("minimax-h3").validate_video(request(**fields))
    assert err.value.param == param


@pytest.mark.parametrize("seconds", [4.0, 9.5, 15.0])
def test_contract_accepts_the_engines_duration_range(seconds):
    get_spec("minimax-h3").validate_video(request(seconds=seconds))


def test_preencoded_mode_returns_mp4_bytes_with_no_audio_arrays(h3):
    pipeline = MiniMaxH3({**FAKE, "preencode_mp4": True})
    pipeline.load()
    result = pipeline.video(request(n=1), RunContext("video_2"))
    assert result.videos is None and result.audio == [None]
    assert result.mp4[0][4:8] == b"ftyp"
    assert not probe_video(result.mp4[0]).faststart  # as vLLM-Omni writes it
    assert pipeline._bridge.engine.requests[-1]["params"][1].extra_args["preencode_mp4"]


def test_engine_client_error_is_not_retryable_and_keeps_its_message(h3):
    from core.errors import EngineRejected

    with pytest.raises(EngineRejected) as err:
        h3.video(request(prompt="[guardrail] a forbidden scene"), RunContext("video_3"))
    assert not err.value.retryable and err.value.code == "engine_rejected"
    assert "content policy" in err.value.message and len(err.value.message) <= 240


# ---- through the real worker path -------------------------------------------------------

@pytest.fixture
def h3_rt(rt):  # noqa: F811
    rt.settings.pipelines = [*rt.settings.pipelines, "minimax-h3"]
    rt.settings.pipeline_options = {"minimax-h3": FAKE}
    return rt


def video_packets(data: bytes) -> list[bytes]:
    with av.open(io.BytesIO(data), format="mp4") as container:
        stream = container.streams.video[0]
        return [bytes(p) for p in container.demux(stream) if p.size]


@pytest.mark.parametrize("preencode", [False, True])
def test_default_length_off_grid_size_job_reports_what_the_engine_made(h3_rt, app, tenant,  # noqa: F811
                                                                       preencode):
    """5 s asks for 120 frames: the engine makes 124 (17n+5); 480x270 becomes 480x256."""
    h3_rt.settings.pipeline_options = {"minimax-h3": {**FAKE, "preencode_mp4": preencode}}
    job = submit(h3_rt, tenant, "minimax-h3", prompt="Fireworks over a harbour.", seconds=5.0,
                 size="480x270", fps=24, n=1, seed=3, generate_audio=True)
    assert outcome(run_job(h3_rt, app, job.id)) == "completed", h3_rt.jobs.get(job.id)
    [out] = h3_rt.jobs.get(job.id).outputs
    stored = h3_rt.store.get(out.key)
    probe = probe_video(stored)
    assert probe.video_codec == "h264" and probe.audio.codec == "aac" and probe.faststart
    assert (out.frames, out.width, out.height) == (probe.frames, 480, 256) == (124, 480, 256)
    assert out.duration_s == pytest.approx(124 / 24, abs=1e-3)
    assert out.sample_rate == 32000 and out.channels == 2
    assert abs(probe.duration_s - probe.audio.duration_s) <= 1 / 24 + 2048 / 32000 + 0.05
    if preencode:  # remuxed by stream copy: the engine's coded frames, byte for byte
        engine = h3_rt.pipeline("minimax-h3")._bridge.engine
        assert video_packets(stored) == video_packets(engine.last_mp4[0])
        assert not probe_video(engine.last_mp4[0]).faststart


def test_rejected_request_fails_at_once_with_the_engines_message(h3_rt, app, tenant):  # noqa: F811
    job = submit(h3_rt, tenant, "minimax-h3", prompt="[guardrail] forbidden", seconds=4.0,
                 size="448x256", fps=24, n=1, seed=1)
    assert outcome(run_job(h3_rt, app, job.id)) == "failed"
    failed = h3_rt.jobs.get(job.id)
    assert failed.attempts == 1 and failed.error_code == "engine_rejected"
    assert "content policy" in failed.error_message


def test_a_recorded_seed_reproduces_the_clip(h3_rt, app, tenant):  # noqa: F811
    def render(seed: int) -> bytes:
        job = submit(h3_rt, tenant, "minimax-h3", prompt="A kite at noon.", seconds=4.0,
                     size="448x256", fps=24, n=1, seed=seed)
        assert outcome(run_job(h3_rt, app, job.id)) == "completed"
        sent = h3_rt.pipeline("minimax-h3")._bridge.engine.requests[-1]["params"][1]
        assert sent.seed == seed
        return h3_rt.store.get(h3_rt.jobs.get(job.id).outputs[0].key)

    first = render(123456)
    assert video_packets(render(123456)) == video_packets(first)
    assert video_packets(render(654321)) != video_packets(first)


def test_unseeded_video_gets_a_random_seed_recorded_at_submit():
    from api.routes.videos import draw_seed

    seeds = {draw_seed("tenant", None) for _ in range(8)}
    assert len(seeds) > 1 and all(0 <= s < 2**31 for s in seeds)
    # a retried submit with the same Idempotency-Key must carry the same request
    assert draw_seed("tenant", "key-1") == draw_seed("tenant", "key-1")
    assert draw_seed("tenant", "key-1") != draw_seed("other", "key-1")
