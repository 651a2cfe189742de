"""The fake engine batches as vLLM does: each stage holds at most its deploy's
``max_num_seqs`` sequences, a guided request's companion is a sequence, a request beyond
them waits inside the engine, and one decode step advances every running request by a
frame. Without this, a test or benchmark of a worker that keeps eight jobs in flight
would measure nothing."""

from __future__ import annotations

import asyncio
import copy
import json

import pytest

from tests.fake_omni import CHUNK_FRAMES, HOP, FakeOmni

WORDS_PER_S = 4  # the fake speaks 0.25 s a word: 50 codec frames a second


def text(seconds: float) -> str:
    return " ".join(["word"] * int(seconds * WORDS_PER_S))


def params(engine: FakeOmni, guided: bool = False) -> list:
    p = copy.deepcopy(engine.default_sampling_params_list)
    for stage in p:
        stage.output_kind = "DELTA"
    if guided:
        p[0].extra_args = {"cfg_scale": 2.0, "cfg_role": "cond"}
    return p


async def collect(engine: FakeOmni, request_id: str, seconds: float,
                  guided: bool = False) -> tuple[int, str | None]:
    """(samples, finish reason) of one request."""
    samples, reason = 0, None
    async for out in engine.generate({"prompt": text(seconds)}, request_id=request_id,
                                     sampling_params_list=params(engine, guided)):
        audio = out.multimodal_output.get("audio")
        for chunk in audio if isinstance(audio, list) else [audio]:
            samples += 0 if chunk is None else len(chunk)
        reason = out.outputs[0].finish_reason
    return samples, reason


def engine(**kwargs) -> FakeOmni:
    return FakeOmni("audex", "audex_tts.yaml", **kwargs)


def test_the_deploy_sets_eight_sequences_per_stage_and_the_engine_arguments_override_it():
    assert engine().max_num_seqs == (8, 8)
    assert engine(max_num_seqs=16).max_num_seqs == (16, 16)
    assert engine(stage_0_max_num_seqs=4).max_num_seqs == (4, 8)
    assert [s.engine_args.max_num_seqs for s in engine(max_num_seqs=2).stage_configs] == [2, 2]
    assert FakeOmni("h3", "minimax_h3_disaggregated.yaml").max_num_seqs == (1, 1)


def test_eight_requests_decode_together_and_a_ninth_waits_inside_the_engine():
    """Nine 2 s requests at once: eight run, each step advances them all (100 steps for
    eight, not 800), and the ninth starts when the first ones end."""
    fake = engine(step_cost_s=(0.0, 0.0))

    async def run() -> list:
        return await asyncio.gather(*(collect(fake, f"r{i}", 2.0) for i in range(9)))

    results = asyncio.run(run())
    assert all(r == (2.0 * 16000, "stop") for r in results)
    assert fake.peak_seqs == 8
    assert fake.scheduler_steps == 2 * 100  # the ninth ran alone after the batch


def test_four_guided_requests_fill_eight_sequences():
    fake = engine(step_cost_s=(0.0, 0.0))

    async def run() -> list:
        return await asyncio.gather(*(collect(fake, f"g{i}", 1.0, guided=True)
                                      for i in range(5)))

    results = asyncio.run(run())
    assert all(r == (16000, "stop") for r in results)
    assert fake.peak_seqs == 8  # four pairs; the fifth waited for a pair to end
    assert fake.scheduler_steps == 2 * 50


def test_a_step_costs_more_with_more_sequences(tmp_path):
    """The cost of each step is the base plus a share per running sequence: one request
    alone takes about ``frames x (a + b)``, eight together about ``frames x (a + 8b)``,
    so eight finish in far less than eight times one's time."""
    fake = engine(step_cost_s=(0.0, 0.002))
    loop_time = []

    async def timed(n: int) -> None:
        start = asyncio.get_running_loop().time()
        await asyncio.gather(*(collect(fake, f"t{n}-{i}", 0.5) for i in range(n)))
        loop_time.append(asyncio.get_running_loop().time() - start)

    async def run() -> None:
        await timed(1)
        await timed(8)

    asyncio.run(run())
    one, eight = loop_time
    assert eight >= 8 * 25 * 0.002  # every step of the batch paid for eight sequences
    assert one >= 25 * 0.002


def test_an_abort_ends_one_request_and_the_others_run_on():
    fake = engine(step_cost_s=(0.001, 0.0))

    async def run() -> list:
        tasks = [asyncio.ensure_future(collect(fake, f"a{i}", 2.0)) for i in range(4)]
        while fake.peak_seqs < 4:
            await asyncio.sleep(0.001)
        await fake.abort("a2")
        return await asyncio.gather(*tasks)

    results = asyncio.run(run())
    assert results[2][1] == "abort" and results[2][0] < 2.0 * 16000
    assert [r for i, r in enumerate(results) if i != 2] == [(2.0 * 16000, "stop")] * 3


def test_a_held_engine_admits_but_does_not_step_and_says_so(tmp_path):
    """While the hold file exists the engine takes requests and emits nothing; the
    stats file tells another process what it holds."""
    hold, stats = tmp_path / "hold", tmp_path / "stats.json"
    hold.touch()
    fake = engine(hold_file=str(hold), stats_file=str(stats), step_cost_s=(0.0, 0.0))

    async def run() -> list:
        tasks = [asyncio.ensure_future(collect(fake, f"h{i}", 1.0, guided=i < 2))
                 for i in range(7)]
        while not stats.exists() or json.loads(stats.read_text())["running_seqs"] < 8:
            await asyncio.sleep(0.001)
        seen = json.loads(stats.read_text())
        assert seen["steps"] == 0 and all(not t.done() for t in tasks)
        assert sorted(seen["running"]) == [f"h{i}" for i in range(6)]
        assert seen["waiting"] == ["h6"]
        hold.unlink()
        return await asyncio.gather(*tasks)

    assert all(r == (16000, "stop") for r in asyncio.run(run()))
    final = json.loads(stats.read_text())
    assert final["peak_seqs"] == 8 and final["running"] == [] and final["waiting"] == []


@pytest.mark.parametrize("seconds", [0.02, 0.5, 3.3])
def test_chunks_come_per_two_codec_chunks_as_before(seconds):
    """The batching changes when outputs come, not what they hold: one frame first,
    then 25-frame chunks, two to an output."""
    fake = engine(step_cost_s=(0.0, 0.0))

    async def run() -> list:
        return [out async for out in fake.generate(
            {"prompt": text(seconds) or "word"}, request_id="c",
            sampling_params_list=params(fake))]

    outs = asyncio.run(run())
    frames = round(max(1, int(seconds * WORDS_PER_S)) / WORDS_PER_S * 50)
    chunks = 1 + -(-(frames - 1) // CHUNK_FRAMES)
    assert len(outs) == -(-chunks // 2)
    assert outs[-1].finished and not any(o.finished for o in outs[:-1])
    total = sum(len(c) for o in outs for c in (o.multimodal_output["audio"]
                if isinstance(o.multimodal_output["audio"], list)
                else [o.multimodal_output["audio"]]))
    assert total == frames * HOP
