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
from pipelines.t2va import H3_CANVASES, H3_RATIOS, MiniMaxH3
from tasks.render import run_job
from tests import fake_omni
from tests import omni_source as src

from ..tasks.test_render import app, outcome, rt, submit, tenant  # noqa: F401  (fixtures)

FAKE = {"engine_factory": "tests.fake_omni:make_engine"}

import_pipeline_modules()


def request(**kw) -> VideoRequest:
    base = dict(prompt="A heron lifts off a misty lake.", seconds=4.0, width=448, height=256,
                fps=24, n=2, seed=11)
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
                              "modalities": ["video"]}
    gp = sent["params"][1]
    assert (gp.width, gp.height, gp.fps) == (448, 256, 24)
    assert (gp.seed, gp.num_outputs_per_prompt) == (11, 2)
    # only what H3 reads: no generate_sound (Cosmos3's), no guidance of ours
    assert gp.extra_args == {"duration": 4.0, "aspect_ratio": "16:9"}
    assert gp.guidance_scale == engine.default_sampling_params_list[1].guidance_scale
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
    ("1536x672", "21:9"), ("1550x664", "21:9"), ("1280x720", "16:9"), ("1344x768", "16:9"),
    ("1024x768", "4:3"), ("512x512", "1:1"), ("768x1024", "3:4"), ("720x1280", "9:16"),
    ("768x1344", "9:16")])
def test_every_supported_size_sends_its_named_aspect_ratio(size, ratio):
    w, h = (int(v) for v in size.split("x"))
    req = request(width=w, height=h, n=1)
    get_spec("minimax-h3").validate_video(req)
    gp = sent_params(req)
    assert gp.extra_args["aspect_ratio"] == ratio
    height, width, frames, *_ = fake_omni.h3_shape("t2va", gp, None)  # the engine accepts it
    assert (frames, width, height) == get_spec("minimax-h3").video.rendered(req)


def test_the_canvases_are_the_engines_own():
    """resolve_minimax_h3_output_canvas (preprocessing.py:152-169), run from its source."""
    canvas = fake_omni._h3_ns["resolve_minimax_h3_output_canvas"]
    ratios = src.constants("model_executor/models/minimax_h3/preprocessing.py")[
        "MINIMAX_H3_SUPPORTED_ASPECT_RATIOS"]
    assert {(w, h): f"{r[0]}:{r[1]}" for (w, h), r in H3_CANVASES.items()} == {
        canvas(value, 768)[::-1]: name for name, value in ratios.items()}
    consts = src.constants("model_executor/models/minimax_h3/preprocessing.py")
    assert get_spec("minimax-h3").video.max_pixels == consts["MINIMAX_H3_OUTPUT_MAX_PIXELS"]


@pytest.mark.parametrize("size", [(1920, 1080), (1792, 768), (1024, 1792), (1152, 1152),
                                  (1920, 1920)])
def test_a_size_over_the_engines_area_cap_names_the_sizes_it_renders(size):
    """Explicit width and height skip H3's own area cap, so the spec applies it."""
    with pytest.raises(InvalidRequest) as err:
        get_spec("minimax-h3").validate_video(request(width=size[0], height=size[1]),
                                              "MiniMaxAI/MiniMax-H3")
    assert err.value.param == "size" and "'MiniMaxAI/MiniMax-H3'" in err.value.message
    assert "over the 1032192 pixels" in err.value.message
    assert "1536x672, 1344x768, 1024x768, 768x768, 768x1024, 768x1344" in err.value.message


@pytest.mark.parametrize(("field", "value"), [("negative_prompt", "blurry"),
                                              ("guidance_scale", 5.5), ("guidance_scale", 1.0)])
def test_fields_h3_would_ignore_are_refused_naming_the_model(field, value):
    """No negative branch (CFG-distilled, pipeline_minimax_h3.py:837); guidance is read only
    by FastH3 (fasth3_checkpoint.py:130-131)."""
    with pytest.raises(InvalidRequest) as err:
        get_spec("minimax-h3").validate_video(request(**{field: value}), "minimax-h3")
    assert (err.value.param, err.value.code) == (field, "unsupported_parameter")
    assert f"'{field}' is not supported by 'minimax-h3'" in err.value.message


def test_the_silence_timeout_grows_with_n_and_length():
    pipeline = MiniMaxH3({**FAKE, "request_timeout_s": 100})
    assert pipeline.timeout_s(request(n=1, seconds=4.0)) == 100  # 107 frames: under 5 s
    assert pipeline.timeout_s(request(n=3, seconds=4.0)) == 300
    assert pipeline.timeout_s(request(n=2, seconds=15.0)) == pytest.approx(
        100 * 2 * 362 / 24 / 5)  # 360 frames asked, 362 rendered
    assert MiniMaxH3(FAKE).timeout_s(request(n=1)) == 1800


def test_a_long_render_of_n_clips_is_not_taken_for_a_dead_engine():
    """The fake answers once, after every clip (6 ms a frame each): four 4 s clips keep it
    silent for about 2.6 s, over the 1.5 s allowed one clip, well under the 6 s for four."""
    pipeline = MiniMaxH3({**FAKE, "request_timeout_s": 1.5})
    pipeline.load()
    result = pipeline.video(request(prompt="[slow] A heron, four times", n=4),
                            RunContext("video_slow"))
    assert len(result.videos) == 4


@pytest.mark.parametrize(("fields", "param"), [
    ({"seconds": 3.9}, "seconds"), ({"seconds": 15.5}, "seconds"), ({"seconds": 1.0}, "seconds"),
    ({"fps": 30}, "fps"), ({"fps": 25}, "fps"), ({"fps": 60}, "fps"),
    ({"width": 1000, "height": 200}, "size"), ({"width": 30, "height": 30}, "size"),
    ({"width": 1920, "height": 1080}, "size"),
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


@pytest.mark.parametrize("preencode", [False, True])
def test_generate_audio_false_leaves_the_track_out(h3_rt, app, tenant, preencode):  # noqa: F811
    """H3 renders sound whatever it is asked (only Cosmos3 reads generate_sound,
    pipeline_cosmos3.py:1796): the job drops it, from the engine's own MP4 too, and
    reports no audio."""
    h3_rt.settings.pipeline_options = {"minimax-h3": {**FAKE, "preencode_mp4": preencode}}
    job = submit(h3_rt, tenant, "minimax-h3", prompt="A silent film.", seconds=4.0,
                 size="448x256", fps=24, n=2, seed=5, generate_audio=False)
    assert outcome(run_job(h3_rt, app, job.id)) == "completed", h3_rt.jobs.get(job.id)
    for out in h3_rt.jobs.get(job.id).outputs:
        probe = probe_video(h3_rt.store.get(out.key))
        assert probe.audio is None and probe.faststart and probe.frames == 107
        assert (out.sample_rate, out.channels) == (None, None)
    if preencode:  # the engine did mux its sound in; the stream copy left it out
        assert probe_video(h3_rt.pipeline("minimax-h3")._bridge.engine.last_mp4[0]).audio


def test_the_fake_decoder_is_off_the_video_by_what_a_real_one_may_be():
    """The A/V rule (1/fps + 1/sample rate) covers H3's slack: its audio sits on a 40 Hz
    latent grid computed from the aligned frames (time_request.py:34-36,
    encoder_processing.py:205-210), at most half a latent off, and the decoder's waveform
    comes back untrimmed; the fake adds up to one latent (25 ms) of decoder edge."""
    from media.video import check_sync

    worst = 0
    for frames in range(5, 15 * 24 + 17, 17):  # every length H3 renders
        latents = round(frames / 24 * 40)
        for edge in (-fake_omni.H3_DECODER_EDGE, fake_omni.H3_DECODER_EDGE):
            samples = latents * 800 + edge
            check_sync(frames, 24, samples, 32000)
            worst = max(worst, abs(samples / 32000 - frames / 24))
    assert 0.025 < worst < 1 / 24
    edges = {fake_omni.decoder_edge(seed) for seed in range(50)}
    assert min(edges) < -400 and max(edges) > 400  # the fake really is that far off


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
