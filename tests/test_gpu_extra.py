"""The ``[gpu]`` extra installs the engine stack the code is written for.

vllm-omni 0.30.0 needs ``transformers>=5.13,<5.15`` and patches one vllm line; newer vllm
releases need newer transformers, so unpinned, pip backtracks vllm-omni to an older
release than the code targets. The extra pins one set, and this resolves ``.[gpu]`` the
way a GPU host installs it (from a fresh virtual environment, with this machine's pip
configuration), without installing anything, so a pin that drifts out of a working set
fails here. A resolver that cannot run (no index, a timeout) skips locally and fails in
CI.

The fresh environment is an empty venv: this venv's pip resolves into it with
``--python`` (the target's interpreter, markers and empty site-packages decide, as on the
host), instead of ensurepip installing a pip of its own first (seconds). Where an index
serves no separate metadata file (PEP 658), ``fast-deps`` reads each wheel's METADATA
with HTTP range requests instead of downloading the wheel (1.5 GB in all, vllm's alone
300 MB): the same bytes, so the same resolution.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
import venv

import pytest

from pipelines.omni_bridge import ENGINE_STACK

from .services import ROOT, unavailable

PINS = {"vllm": "0.30.0", "vllm-omni": "0.30.0", "torch": "2.13.0"}
RESOLVE_TIMEOUT_S = 900  # about a minute on a quiet machine: 270 distributions' metadata


def extra_pins() -> dict[str, str]:
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["gpu"]
    exact = [re.fullmatch(r"([A-Za-z0-9_.-]+)==([0-9][^,;\s]*)", req) for req in extra]
    assert all(exact), f"every [gpu] requirement is an exact pin: {extra}"
    return dict(m.groups() for m in exact)


def test_one_engine_stack_everywhere_it_is_named():
    pins = extra_pins()
    assert pins == PINS
    assert ENGINE_STACK == {d: pins[d] for d in ENGINE_STACK}  # the worker's start-up check
    docker = (ROOT / "Dockerfile.gpu").read_text()
    assert f"ARG BASE=vllm/vllm-openai:v{pins['vllm']}\n" in docker
    instructions = re.sub(r"\\\n\s*", " ", docker).splitlines()  # continuations joined
    [install] = [line for line in instructions if "pip install" in line]
    assert set(re.findall(r"'([a-z-]+==[0-9.]+)'", install)) == {
        f"{d}=={v}" for d, v in pins.items()} and "'.[gpu]'" in install
    # into a venv that sees the image's packages, held to the image's own versions
    assert "python3 -m venv --system-site-packages /opt/omnijobs" in install
    assert "pip freeze --all" in install and "-c /tmp/image-constraints.txt" in install
    assert f"'vllm-omni=={pins['vllm-omni']}'" in (ROOT / "Makefile").read_text()


@pytest.fixture(scope="module")
def resolved(tmp_path_factory) -> dict[str, str]:
    """``pip install --dry-run --report`` of ``.[gpu]`` from a fresh venv: name -> version."""
    where = tmp_path_factory.mktemp("gpu-resolve")
    venv.EnvBuilder(system_site_packages=False, with_pip=False).create(where / "venv")
    report = where / "report.json"
    try:
        out = subprocess.run(
            [sys.executable, "-m", "pip", "--python", str(where / "venv" / "bin" / "python"),
             "install", "--dry-run", "--ignore-installed", "--quiet", "--use-feature=fast-deps",
             "--report", str(report), ".[gpu]"],
            cwd=ROOT, capture_output=True, text=True, timeout=RESOLVE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        unavailable(f"pip's resolver (no answer in {RESOLVE_TIMEOUT_S} s)")
    if out.returncode != 0:
        if "ResolutionImpossible" in out.stderr or "conflicting dependencies" in out.stderr:
            pytest.fail("the [gpu] extra cannot be installed:\n" + out.stderr[-3000:])
        unavailable("pip's resolver (" + (out.stderr.strip().splitlines() or ["?"])[-1] + ")")
    return {item["metadata"]["name"].lower(): item["metadata"]["version"]
            for item in json.loads(report.read_text())["install"]}


def test_gpu_extra_resolves_to_the_pinned_engine_stack(resolved):
    assert sys.version_info[:2] >= (3, 11)
    # the local label (torch's +cpu or +cu130) is the index's choice, not the pin's: a
    # CPU build installs here, and the worker refuses it at start (test_engine_boundary)
    got = {dist: resolved.get(dist, "missing").split("+")[0] for dist in PINS}
    assert got == PINS
    # vllm-omni 0.30.0's own requirement (its wheel's METADATA): what later vllm breaks
    major, minor = (int(p) for p in resolved["transformers"].split(".")[:2])
    assert (5, 13) <= (major, minor) < (5, 15), resolved["transformers"]
    assert resolved["omnijobs"] == tomllib.loads((ROOT / "pyproject.toml").read_text())[
        "project"]["version"]
