"""Model folders mounted read-only: Audex weights prepared before the engine's first
start, and the one folder every engine start writes kept off the mount.

Nemotron-Labs-Audex checkpoints deduplicate their weights: the shards that
``checkpoint_folder_audiogen/model.safetensors.index.json`` lists live only in the sibling
``checkpoint_folder_full/``. On its first start vLLM-Omni 0.30.0 symlinks each missing
shard into ``checkpoint_folder_audiogen`` (or copies it where it cannot link), from the
stage set-up of every ``audex_thinker`` and ``audex_tta_thinker`` stage
(engine/stage_init_utils.py:1286-1292, model_executor/models/audex/checkpoint.py:153-186).
That write lands in the model folder: on a read-only mount (a ``ReadOnlyMany`` claim) it
fails with EROFS, and on weights a root download left to a non-root worker with EACCES,
and stage 0 never starts.

``omnijobs models prepare PATH`` runs vLLM-Omni's own linking ahead of time, once, with
write access (a Kubernetes Job, a compose one-shot service). A worker given a model
folder that still lacks shards and that it cannot write refuses to start, in one line
saying what to run. The check reads the folder as the engine's helper does: a shard is
there when its path exists, a link followed (checkpoint.py:170-173).

Every start also writes the models' remote code (H3's VAEs, Audex's ``trust_remote_code``
stages) into transformers' module cache, ``$HF_HOME/modules`` unless
``HF_MODULES_CACHE`` says otherwise (transformers/utils/hub.py:107,
dynamic_module_utils.py:85-117). With ``HF_HOME`` on the models mount that write fails
too, so the shipped deployments point ``HF_MODULES_CACHE`` at the worker's own state
folder, and a worker whose module cache it cannot write refuses to start.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from core.errors import ConfigurationError, clip

from .omni_bridge import gpu_import

LINKED_FOLDER = "checkpoint_folder_audiogen"  # model_subdir of the thinker stages
INDEX = "model.safetensors.index.json"
LINKER = "vllm_omni.model_executor.models.audex.checkpoint"  # its ensure_audiogen_weights


def missing_shards(root: str | os.PathLike) -> list[str]:
    """The shards the linked folder's index lists that are not in it yet; none where the
    folder has no readable index (a hub id, another layout: the engine skips those too,
    checkpoint.py:159-167)."""
    folder = Path(root) / LINKED_FOLDER
    try:
        weight_map = json.loads((folder / INDEX).read_text()).get("weight_map", {})
    except (OSError, ValueError):
        return []
    return [s for s in sorted(set(weight_map.values())) if not (folder / s).exists()]


def vllm_omni_linker() -> Callable[[str], None]:
    """vLLM-Omni's own ``ensure_audiogen_weights`` (its module imports vllm, so torch:
    the [gpu] extra, as on the GPU image the prepare step runs from)."""
    return gpu_import(LINKER).ensure_audiogen_weights


def prepare(root: str | os.PathLike,
            linker: Callable[[str], None] | None = None) -> list[str]:
    """Link every missing shard into the model's linked folder; returns those linked.
    Running it again links nothing."""
    root = Path(root)
    if not (root / LINKED_FOLDER / INDEX).is_file():
        raise ConfigurationError(f"{root} has no {LINKED_FOLDER}/{INDEX}: not an Audex "
                                 "checkpoint root", code="not_an_audex_checkpoint")
    missing = missing_shards(root)
    if missing:
        (linker or vllm_omni_linker())(str(root / LINKED_FOLDER))
    left = missing_shards(root)
    if left:
        raise ConfigurationError(f"{len(left)} shard(s) still missing from {root / LINKED_FOLDER} "
                                 f"after linking (first: {left[0]})", code="weights_unprepared")
    return missing


def hf_home() -> str:
    """``HF_HOME`` as huggingface_hub resolves it: else ``$XDG_CACHE_HOME/huggingface``,
    else ``~/.cache/huggingface``."""
    return os.path.expanduser(os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"))


def modules_cache() -> str:
    """Where transformers writes remote code: ``HF_MODULES_CACHE``, else ``modules``
    under ``HF_HOME``."""
    return os.environ.get("HF_MODULES_CACHE") or os.path.join(hf_home(), "modules")


def check_modules_cache() -> None:
    """At a GPU worker's start: the module cache, or the nearest folder above it that
    exists, must be writable by this process."""
    path = modules_cache()
    existing = path
    while not os.path.exists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    if not os.access(existing, os.W_OK):
        raise ConfigurationError(
            f"transformers writes the models' remote code under {path} at every engine "
            f"start, and this worker cannot write {existing} (read-only or another owner): "
            "set HF_MODULES_CACHE to a writable folder (the shipped deployments use "
            "/var/lib/omnijobs/hf-modules)", code="modules_cache_read_only")


# What each pipeline's engine reads of its checkpoint (vLLM-Omni's per-stage download
# profiles, model_executor/models/audex/checkpoint.py:27-48): the folders an offline host
# needs on disk.
NEEDED = {
    "audex-tts": "config.json, checkpoint_folder_audiogen/, checkpoint_folder_full/ and "
                 "audex_causal_speech_decoder/",
    "audex-tta": "config.json, checkpoint_folder_audiogen/ and checkpoint_folder_full/, "
                 "and hf-audio/xcodec-hubert-general-balanced for the decoder",
    "minimax-h3": "the whole repository",
}


def offline() -> bool:
    """HF_HUB_OFFLINE as huggingface_hub reads it (1, ON, YES or TRUE)."""
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}


def hub_cache() -> str:
    """Where the hub keeps its snapshots: ``HF_HUB_CACHE``, else ``hub`` under
    ``HF_HOME``."""
    return os.environ.get("HF_HUB_CACHE") or os.path.join(hf_home(), "hub")


def check_reachable(model: str, pipeline: str) -> None:
    """On an offline host (HF_HUB_OFFLINE), a Hub id the hub cache holds no snapshot of
    cannot load: vLLM-Omni would try the network for the whole repository first
    (entrypoints/omni_base.py:77-120) and fail deep in the start. Refuse it in one line
    saying what to download and where to point the option."""
    if not offline() or os.path.isdir(model):
        return
    snapshots = Path(hub_cache()) / ("models--" + model.replace("/", "--")) / "snapshots"
    if snapshots.is_dir() and any(snapshots.iterdir()):
        return
    raise ConfigurationError(
        f"model {clip(model)!r} is a Hub id, this host is offline (HF_HUB_OFFLINE) and the "
        f"hub cache ({hub_cache()}) holds no copy of it: download "
        f"{NEEDED.get(pipeline, 'the repository')} to a folder and set the pipeline "
        f"option model of {pipeline} to it", code="model_unreachable")


def check_prepared(root: str) -> None:
    """At a worker's start: refuse an unprepared model folder the engine cannot write,
    before the engine fails on it deep in stage 0. A writable one is left to the engine,
    which links it itself."""
    if not os.path.isdir(root):
        return  # a hub id: the engine downloads into its cache and links there
    missing = missing_shards(root)
    folder = os.path.join(root, LINKED_FOLDER)
    if missing and not os.access(folder, os.W_OK):
        raise ConfigurationError(
            f"the Audex weights in {root} are not prepared ({len(missing)} shard(s) of "
            f"{LINKED_FOLDER} are still to be linked from checkpoint_folder_full) and this "
            f"worker cannot write there (read-only or another owner): run `omnijobs models "
            f"prepare {root}` once with write access (Kubernetes: the omnijobs-models-prepare "
            "Job; compose: the models-prepare service), then start the worker",
            code="weights_unprepared")
