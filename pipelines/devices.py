"""The GPUs a vLLM-Omni deploy config places its stages on, and the check that a worker
sees that many before it builds the engine.

A stage's ``devices`` ("0,1") are positions in the worker's own ``CUDA_VISIBLE_DEVICES``
list when that is set, physical indexes when it is not (vllm_omni/entrypoints/
stage_utils.py:120-183). So a worker needs as many visible GPUs as the highest position
its deploy names, plus one: ``minimax_h3_disaggregated.yaml`` puts its encoder on "0,1"
and its DiT on "2,3,4,5", six GPUs. A worker that sees fewer fails deep in stage
initialisation, or, where every id is past the visible count, vLLM-Omni takes the ids as
physical ones and runs on GPUs outside the worker's own (stage_utils.py:146-155). In a
container, the runtime already numbers the devices it gives from 0: the worker takes no
``--gpu`` there, and ``--gpu 1`` in a container given one device leaves it none.

Read with PyYAML, not vllm-omni's loader (``config/stage_config.py:763``), which imports
torch: the deploy files and their tests check the same rule on machines without it.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Any

import yaml

from core.errors import ConfigurationError


def deploy_folder() -> Path | None:
    """vllm-omni's shipped deploy configs (``vllm_omni/deploy/``), found without importing
    the package (its import needs torch)."""
    spec = importlib.util.find_spec("vllm_omni")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(spec.submodule_search_locations[0]) / "deploy"


def deploy_path(deploy_config: str) -> Path:
    """A path as given, else a name in vllm-omni's deploy folder."""
    path = Path(deploy_config)
    if path.is_file():
        return path
    folder = deploy_folder()
    if folder is not None and (folder / deploy_config).is_file():
        return folder / deploy_config
    raise ConfigurationError(f"deploy config {deploy_config!r} is neither a file nor one of "
                             "vllm-omni's shipped deploy configs", code="unknown_deploy_config")


@functools.cache
def stage_devices(deploy_config: str) -> dict[int, tuple[int, ...]]:
    """stage_id -> the device positions it names, ``base_config`` overlays resolved as
    vllm-omni resolves them (config/stage_config.py:719-789: an overlay's stage replaces
    the fields it names of the base's stage with the same id)."""
    path = deploy_path(deploy_config)
    raw: dict[str, Any] = yaml.safe_load(path.read_text()) or {}
    stages: dict[int, dict[str, Any]] = {}
    base = raw.get("base_config")
    if base:
        base_file = path.parent / base
        for sid, devices in stage_devices(str(base_file)).items():
            stages[sid] = {"devices": ",".join(map(str, devices))}
    for stage in raw.get("stages") or []:
        stages.setdefault(int(stage["stage_id"]), {}).update(
            {k: v for k, v in stage.items() if k == "devices"})
    return {sid: tuple(int(d) for d in str(s.get("devices", "0")).split(",") if d.strip())
            for sid, s in sorted(stages.items())}


def gpus_needed(deploy_config: str) -> int:
    """How many visible GPUs the deploy's stages need: the highest position named, +1."""
    return max((max(d) for d in stage_devices(deploy_config).values() if d), default=0) + 1


def check_visible(deploy_config: str, visible: int, cuda_visible: str | None) -> None:
    """Refuse to build an engine whose stages name more GPUs than this process sees, in
    one line that says how many to give it and how."""
    needed = gpus_needed(deploy_config)
    if visible >= needed:
        return
    raise ConfigurationError(
        f"{Path(deploy_config).name} places its stages on {needed} GPU(s) (positions 0-"
        f"{needed - 1}); this process sees {visible} (CUDA_VISIBLE_DEVICES="
        f"{cuda_visible if cuda_visible is not None else 'unset'}): give the worker {needed} "
        f"GPU(s): on a host, --gpu with {needed} indexes; in a container, reserve {needed} "
        "devices and pass no --gpu (the runtime numbers them from 0)",
        code="too_few_gpus")
