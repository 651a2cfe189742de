"""Key lifecycle through the CLI against the running API, and what its logs never hold."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import httpx

from ..integration.helpers import assert_openai_error
from ..services import ROOT


def _listed(stack, tenant: str) -> list[list[str]]:
    lines = stack.cli("keys", "list", "--tenant", tenant).splitlines()
    assert lines[0].split()[:2] == ["prefix", "created"]
    return [line.split() for line in lines[1:]]


def test_list_shows_prefix_created_last_used_and_revoked(stack):
    tenant = "keys-" + uuid.uuid4().hex[:8]
    used, unused = stack.new_key(tenant), stack.new_key(tenant)
    with stack.client(used) as client:
        assert client.get("/v1/jobs").status_code == 200
    rows = {row[0]: row for row in _listed(stack, tenant)}
    assert set(rows) == {used[:10], unused[:10]}
    listing = stack.cli("keys", "list", "--tenant", tenant)
    assert used not in listing and unused not in listing  # never the keys themselves
    assert rows[unused[:10]][3:] == ["-", "-"]  # never used, not revoked
    assert rows[used[:10]][3] != "-" and rows[used[:10]][-1] == "-"


def test_revoked_key_is_refused_within_seconds(stack):
    tenant = "revoke-" + uuid.uuid4().hex[:8]
    key, other = stack.new_key(tenant), stack.new_key(tenant)
    with stack.client(key) as client, stack.client(other) as still_good:
        assert client.get("/v1/jobs").status_code == 200  # now cached by the API
        out = stack.cli("keys", "revoke", key[:10])
        assert key[:10] in out and tenant in out
        revoked_at = time.monotonic()
        while client.get("/v1/jobs").status_code == 200:
            assert time.monotonic() - revoked_at < 15, "revoked key still accepted"
            time.sleep(0.2)
        assert_openai_error(client.get("/v1/jobs"), 401, "invalid_api_key")
        assert still_good.get("/v1/jobs").status_code == 200
    row = next(r for r in _listed(stack, tenant) if r[0] == key[:10])
    assert row[-1] != "-"


def test_revoke_of_an_unknown_prefix_fails_clearly(stack):
    out = subprocess.run([sys.executable, "-m", "omnijobs.cli", "keys", "revoke",
                          "oj-nothing"], env=stack.env, cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode != 0 and "no API key with prefix" in out.stderr


def test_logs_hold_no_key_secret_or_signature(stack):
    key = stack.new_key("logs-" + uuid.uuid4().hex[:8])
    marker = "f" * 64
    with stack.client(key) as client:
        client.get("/v1/jobs", params={"after": "job_" + "0" * 32})
        client.post("/v1/audio/speech", json={"model": "tts-1", "input": "Logged?"},
                    headers={"Prefer": "respond-async"})
        client.get("/v1/objects/t/j/0.wav", params={"expires": 1, "signature": marker})
    httpx.get(f"{stack.base_url}/v1/jobs", headers={"Authorization": "Bearer oj-wrong-key"})
    secrets = [key, key[10:], "oj-wrong-key", marker, "signature=",
               stack.env["OMNIJOBS_SIGNING_SECRET"], stack.env["OMNIJOBS_S3_SECRET_ACCESS_KEY"]]
    api_log = stack.processes["api"].log.read_text(errors="replace")
    assert '"path": "/v1/jobs"' in api_log  # the access log is there, just clean
    for proc in stack.processes.values():
        text = proc.log.read_text(errors="replace")
        for secret in secrets:
            assert secret not in text, f"{proc.name} log holds {secret[:12]}..."
