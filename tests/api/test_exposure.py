"""What is reachable from the network by default: no embedded mode with the placeholder
secret on a public address, no metrics on the public port."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from ..services import ROOT, free_port

DOCKERFILE = (ROOT / "Dockerfile").read_text()


def _cli(args: list[str], home: Path, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OMNIJOBS_")}
    clean.update(OMNIJOBS_HOME=str(home), PYTHONPATH=str(ROOT), COLUMNS="400", **env)
    return subprocess.run([sys.executable, "-m", "omnijobs.cli", *args], env=clean, cwd=home,
                          capture_output=True, text=True, timeout=60)


def _docker_env() -> dict[str, str]:
    env = {}
    for line in DOCKERFILE.splitlines():
        if line.startswith("ENV "):
            env.update(pair.split("=", 1) for pair in shlex.split(line[4:]) if "=" in pair)
    return env


def test_api_refuses_a_public_address_with_the_placeholder_secret(tmp_path):
    out = _cli(["api", "--host", "0.0.0.0", "--port", str(free_port())], tmp_path)
    assert out.returncode != 0 and "placeholder signing secret" in out.stderr


def test_dev_binds_loopback_unless_allowed_with_a_real_secret(tmp_path):
    port = str(free_port())
    out = _cli(["dev", "--host", "0.0.0.0", "--port", port], tmp_path)
    assert out.returncode != 0 and "--allow-remote" in out.stderr
    out = _cli(["dev", "--host", "0.0.0.0", "--port", port, "--allow-remote"], tmp_path)
    assert out.returncode != 0 and "placeholder signing secret" in out.stderr
    assert not (tmp_path / ".omnijobs" / "omnijobs.db").exists()  # refused before anything


def test_image_default_command_does_not_serve_embedded_mode(tmp_path):
    env = _docker_env()
    assert env["OMNIJOBS_MODE"] == "production"
    cmd = next(line for line in DOCKERFILE.splitlines() if line.startswith("CMD "))
    args = __import__("json").loads(cmd[4:])
    assert args[:2] == ["omnijobs", "api"]
    env.pop("OMNIJOBS_HOME")
    out = _cli(args[1:], tmp_path, **env)
    assert out.returncode != 0
    assert "OMNIJOBS_SIGNING_SECRET" in out.stderr


@pytest.mark.parametrize("public", [False, True])
def test_metrics_are_on_the_public_port_only_when_asked(make_api, public):
    with make_api(metrics_public=public).client() as anon:
        resp = anon.get("/metrics")
    assert resp.status_code == (200 if public else 404)
    if public:
        assert "omnijobs_jobs_submitted_total" in resp.text
