"""Audex weights on a read-only mount: vLLM-Omni links the deduplicated shards into the
model folder on its first start, which fails there (EROFS). `omnijobs models prepare`
links them ahead of time with vLLM-Omni's own helper; a worker given an unprepared
read-only folder refuses in one line that says what to run.

The read-only mount is a real one, private to the process under test (``unshare -m``, a
bind mount remounted read-only): root writes through file modes, not through that."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.weights import LINKED_FOLDER, check_prepared, missing_shards, prepare
from tests.fake_omni import ensure_audiogen_weights

from ..test_cli import ROOT, omnijobs, one_line_error

SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
FAKE = {"engine_factory": "tests.fake_omni:make_engine",
        "tokenizer_factory": "tests.fake_omni:make_tokenizer"}


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    """An Audex TTS checkpoint root as the hub ships it: the shards only in
    checkpoint_folder_full, listed by checkpoint_folder_audiogen's index."""
    root = tmp_path / "Nemotron-Labs-Audex-2B"
    full, linked = root / "checkpoint_folder_full", root / LINKED_FOLDER
    for folder in (full, linked, root / "audex_causal_speech_decoder"):
        folder.mkdir(parents=True)
    for i, shard in enumerate(SHARDS):
        (full / shard).write_bytes(bytes([i]) * 64)
    (linked / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"model.a": SHARDS[0], "model.b": SHARDS[1], "model.c": SHARDS[1]}}))
    return root


def read_only(root: Path, *argv: str) -> list[str]:
    """``argv`` run with ``root`` mounted read-only for it alone."""
    return ["unshare", "-m", "sh", "-c", 'mount --bind -o ro "$0" "$0" && exec "$@"',
            str(root), *argv]


def build_fake_engine(root: Path) -> subprocess.CompletedProcess:
    code = ("from tests.fake_omni import FakeOmni; import sys; "
            "FakeOmni(sys.argv[1], 'audex_tts.yaml'); print('built')")
    return subprocess.run(read_only(root, sys.executable, "-c", code, str(root)), cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_the_engine_fails_its_first_start_on_an_unprepared_read_only_folder(checkpoint):
    """What the shipped read-only mounts did to stage 0 (the fake runs vLLM-Omni's own
    linking, compiled from the wheel)."""
    result = build_fake_engine(checkpoint)
    assert result.returncode != 0 and "Read-only file system" in result.stderr


def worker_under(mount: Path, pipeline: str, options: dict, work: Path,
                 **env: str) -> subprocess.CompletedProcess:
    """``omnijobs worker --pipeline PIPELINE`` with ``mount`` read-only for it."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OMNIJOBS_", "HF_"))}
    clean.update(PYTHONPATH=str(ROOT), OMNIJOBS_PIPELINES=json.dumps([pipeline]),
                 OMNIJOBS_PIPELINE_OPTIONS=json.dumps({pipeline: options}), **env)
    work.mkdir()
    return subprocess.run(read_only(mount, sys.executable, "-m", "omnijobs.cli", "worker",
                                    "--pipeline", pipeline),
                          cwd=work, env=clean, capture_output=True, text=True, timeout=60)


def test_a_worker_refuses_an_unprepared_read_only_folder_in_one_line(checkpoint, tmp_path):
    line = one_line_error(worker_under(checkpoint, "audex-tts",
                                       {"model": str(checkpoint), **FAKE}, tmp_path / "work"))
    assert f"run `omnijobs models prepare {checkpoint}`" in line
    assert "2 shard(s)" in line and "cannot write there" in line


def test_prepare_links_with_vllm_omnis_helper_and_the_read_only_start_then_works(
        checkpoint):
    linker = "tests.fake_omni:ensure_audiogen_weights"
    first = omnijobs(checkpoint.parent, "models", "prepare", str(checkpoint),
                     "--linker", linker)
    assert first.returncode == 0, first.stderr
    assert f"{checkpoint / LINKED_FOLDER}: linked 2 shard(s)" in first.stdout
    for shard in SHARDS:  # relative links into the full checkpoint, as the engine makes
        link = checkpoint / LINKED_FOLDER / shard
        assert os.readlink(link) == os.path.join("..", "checkpoint_folder_full", shard)
        assert link.read_bytes() == (checkpoint / "checkpoint_folder_full" / shard).read_bytes()
    again = omnijobs(checkpoint.parent, "models", "prepare", str(checkpoint),
                     "--linker", linker)
    assert again.returncode == 0 and "already prepared, nothing to link" in again.stdout
    result = build_fake_engine(checkpoint)
    assert result.returncode == 0 and "built" in result.stdout, result.stderr


def test_prepare_refuses_a_folder_that_is_no_audex_checkpoint(tmp_path):
    line = one_line_error(omnijobs(tmp_path, "models", "prepare", str(tmp_path)))
    assert f"{tmp_path} has no {LINKED_FOLDER}/model.safetensors.index.json" in line


def test_prepare_without_the_gpu_extra_names_it(checkpoint):
    """vLLM-Omni's helper imports vllm (so torch): this machine has neither."""
    line = one_line_error(omnijobs(checkpoint.parent, "models", "prepare", str(checkpoint)))
    assert "[gpu] extra" in line


def test_a_writable_unprepared_folder_is_left_to_the_engine(checkpoint):
    assert missing_shards(checkpoint) == list(SHARDS)
    check_prepared(str(checkpoint))  # writable: the engine links it itself
    assert prepare(checkpoint, ensure_audiogen_weights) == list(SHARDS)
    assert missing_shards(checkpoint) == [] and prepare(checkpoint, ensure_audiogen_weights) == []
    check_prepared("nvidia/Nemotron-Labs-Audex-2B")  # a hub id: nothing to check here


def test_a_worker_refuses_a_module_cache_it_cannot_write_in_one_line(tmp_path):
    """HF_HOME on the read-only models mount: every engine start writes remote code
    there (HF_MODULES_CACHE unset)."""
    models = tmp_path / "models"
    (models / "hf").mkdir(parents=True)
    line = one_line_error(worker_under(models, "minimax-h3", FAKE, tmp_path / "work",
                                       HF_HOME=str(models / "hf")))
    assert f"remote code under {models / 'hf' / 'modules'}" in line
    assert "set HF_MODULES_CACHE to a writable folder" in line


def test_an_offline_host_refuses_a_hub_id_it_holds_no_copy_of(monkeypatch, tmp_path):
    from core.errors import ConfigurationError
    from pipelines.weights import check_reachable

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    check_reachable("nvidia/Nemotron-Labs-Audex-2B", "audex-tts")  # online: the engine fetches
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    check_reachable(str(tmp_path), "audex-tts")  # a local folder
    with pytest.raises(ConfigurationError) as info:
        check_reachable("nvidia/Nemotron-Labs-Audex-2B", "audex-tts")
    message = str(info.value)
    assert "'nvidia/Nemotron-Labs-Audex-2B' is a Hub id, this host is offline" in message
    assert "checkpoint_folder_audiogen/" in message and "option model of audex-tts" in message
    assert "\n" not in message and info.value.code == "model_unreachable"
    snapshot = tmp_path / "hub" / "models--nvidia--Nemotron-Labs-Audex-2B" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    check_reachable("nvidia/Nemotron-Labs-Audex-2B", "audex-tts")  # a cached copy loads


def test_a_gpu_worker_on_an_offline_host_refuses_a_hub_id_in_one_line(tmp_path):
    options = json.dumps({"minimax-h3": FAKE})  # the default model: a Hub id
    line = one_line_error(omnijobs(tmp_path, "worker", "--pipeline", "minimax-h3",
                                   OMNIJOBS_PIPELINES='["minimax-h3"]',
                                   OMNIJOBS_PIPELINE_OPTIONS=options, HF_HUB_OFFLINE="1",
                                   HF_HUB_CACHE=str(tmp_path / "hub")))
    assert "'MiniMaxAI/MiniMax-H3' is a Hub id, this host is offline" in line
