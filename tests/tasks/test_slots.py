"""A worker's engine slots: how many it has (the engine's ``max_num_seqs``, or the
``slots`` option), what a job holds (two when guided), and the gate its render threads
pass before they claim."""

from __future__ import annotations

import threading

import pytest

from core.errors import ConfigurationError
from pipelines.audex import AudexTTA, AudexTTS
from pipelines.piper_tts import PiperJoe
from tasks.slots import SlotGate

FAKE = {"engine_factory": "tests.fake_omni:make_engine",
        "tokenizer_factory": "tests.fake_omni:make_tokenizer"}


def loaded(cls, **options):
    pipeline = cls({**FAKE, **options})
    pipeline.load()
    return pipeline


def test_audex_takes_the_smallest_max_num_seqs_of_its_stages():
    assert loaded(AudexTTS).slots() == 8  # audex_tts.yaml: 8 and 8
    assert loaded(AudexTTS, engine_kwargs={"stage_1_max_num_seqs": 6}).slots() == 6
    assert loaded(AudexTTS, slots=3).slots() == 3  # the option overrides the engine


@pytest.mark.parametrize("bad", [0, -1, 2.5, "8", True])
def test_a_bad_slots_option_is_refused_by_name(bad):
    with pytest.raises(ConfigurationError, match="slots"):
        loaded(AudexTTS, slots=bad).slots()


def test_cpu_pipelines_keep_one_job_at_a_time():
    assert PiperJoe({}).slots() == 1


def test_a_guided_job_holds_two_slots():
    tts = loaded(AudexTTS)
    assert tts.slot_weight({"input": "hi"}) == 1
    assert tts.slot_weight({"input": "hi", "cfg_scale": 1.0}) == 1  # 1.0 guides nothing
    assert tts.slot_weight({"input": "hi", "cfg_scale": 1.5}) == 2
    tta = loaded(AudexTTA)
    assert tta.slot_weight({"input": "rain"}) == 2  # TTA is guided at 3.0 by default
    assert tta.slot_weight({"input": "rain", "cfg_scale": 1.0}) == 1


def test_the_gate_waits_for_a_free_slot_and_lets_a_drain_through():
    gate = SlotGate(2)
    assert gate.take() and gate.take()
    got: list[bool] = []
    waiter = threading.Thread(target=lambda: got.append(gate.take()))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive() and not got  # both slots held: it waits
    gate.give(1)
    waiter.join(10)
    assert got == [True] and gate.busy == 2
    stopping = threading.Event()
    drained = threading.Thread(target=lambda: got.append(gate.take(stop=stopping.is_set)))
    drained.start()
    stopping.set()
    drained.join(10)
    assert got == [True, False] and gate.busy == 2  # a drain takes nothing


def test_a_guided_job_takes_its_second_slot_without_waiting():
    """Eight threads each holding one slot and waiting for a second would wait forever;
    the second is taken at once, and nobody takes another until the count is below the
    total again."""
    gate = SlotGate(3)
    assert gate.take() and gate.grow(1) == 1 and gate.busy == 2
    assert gate.take() and gate.grow(1) == 1 and gate.busy == 4  # over: the engine queues it
    gate.give(1)
    assert not gate.take(stop=lambda: True) and gate.busy == 3  # still full: none taken
    gate.give(2)
    assert gate.take() and gate.busy == 2


def test_jobs_failing_together_on_a_dead_engine_signal_the_worker_once(
        tmp_path, sqlite_url, monkeypatch):
    """Eight jobs in flight fail together when their engine dies, and each asks for a
    restart: one SIGTERM, since a second is an operator's "hand everything back now"."""
    from core.settings import Settings
    from tasks import runtime

    rt = runtime.WorkerRuntime(Settings(home=tmp_path, database_url=sqlite_url))
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(runtime.os, "kill", lambda pid, sig: sent.append((pid, sig)))
    threads = [threading.Thread(target=rt.request_restart) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert rt.restart_requested
    assert sent == [(runtime.os.getpid(), runtime.signal.SIGTERM)]
