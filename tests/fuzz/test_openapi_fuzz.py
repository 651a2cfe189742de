"""Schemathesis over ``/openapi.json`` against a real API process: every operation, with
a valid key, with no key and with a wrong key, a bounded number of examples each.

Passes when no answer is a 5xx, every 4xx has OpenAI's error shape, and a key-guarded
operation answers 401 to a request without a valid key. Prints one line of counts.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from ..conftest import migrated_database
from ..services import free_port, spawn, wait_until

EXAMPLES = {"valid": int(os.environ.get("OMNIJOBS_FUZZ_EXAMPLES", "100")), "none": 15,
            "wrong": 15}  # per operation; CI's budget, raise the first for a longer run
ID_PARAMS = ("job_id", "video_id", "endpoint_id")
# CI replays the same examples every run (a red build names a regression, not a lucky
# draw); elsewhere every run draws new ones, and longer runs explore further.
CI = os.environ.get("CI") == "true"
OWNED_HEADERS = {"authorization", "content-length", "transfer-encoding", "host"}


@pytest.fixture(scope="module")
def api_process(tmp_path_factory) -> Iterator[tuple[str, dict[str, str]]]:
    """An API of its own (embedded mode over PostgreSQL, local signed URLs, nothing
    consuming its queue), so the fuzz never loads the shared stack's worker."""
    home = tmp_path_factory.mktemp("fuzz")
    db = migrated_database()
    url = next(db)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNIJOBS_")}
    env.update(OMNIJOBS_HOME=str(home), OMNIJOBS_DATABASE_URL=url,
               OMNIJOBS_SIGNING_SECRET="fuzz-signing-secret-0123456789",
               OMNIJOBS_PIPELINES='["piper-joe", "reference-t2va"]',
               OMNIJOBS_SYNC_WAIT_DEFAULT_S="0", OMNIJOBS_SYNC_WAIT_MAX_S="0",
               OMNIJOBS_EVENT_STREAM_MAX_S="0.5")
    port = free_port()
    proc = spawn("fuzz-api", ["api", "--port", str(port)], env, home)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: httpx.get(f"{base}/readyz", timeout=2).status_code == 200, 60,
                   "fuzz API")
        yield base, env
    finally:
        proc.stop()
        next(db, None)


@dataclass
class Tally:
    examples: Counter = field(default_factory=Counter)
    statuses: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)


def judge(resp, guarded: bool, auth: str) -> str | None:
    """What is wrong with this answer, if anything."""
    if resp.status_code >= 500:
        return f"{resp.status_code}"
    if guarded and auth != "valid" and resp.status_code != 401:
        return f"{resp.status_code} without a valid key"
    if resp.status_code >= 400 and resp.request.method != "HEAD":  # HEAD has no body
        try:
            err = json.loads(resp.content)["error"]
        except (ValueError, KeyError, TypeError):
            return f"{resp.status_code} without an error body"
        if set(err) != {"message", "type", "param", "code"} or not err["message"]:
            return f"{resp.status_code} with a malformed error body"
    return None


def strategies(op, ids: list[str]):
    modes = [op.as_strategy(generation_mode=m)
             for m in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)]
    names = {p.name for p in op.path_parameters}
    for name in names & set(ID_PARAMS):  # real ids too, to get past the lookup
        modes += [op.as_strategy(path_parameters={name: i}) for i in ids]
    return st.one_of(modes)


def fuzz(op, base: str, headers: dict[str, str], auth: str, ids: list[str],
         tally: Tally) -> None:
    guarded = bool(op.definition.raw.get("security"))

    @settings(max_examples=EXAMPLES[auth], deadline=None, database=None, derandomize=CI,
              phases=[Phase.explicit, Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=strategies(op, ids))
    def run(case) -> None:
        # The key is ours to set; framing headers belong to the HTTP client (a generated
        # Content-Length is refused by the HTTP server before the app sees the request).
        case.headers = {k: v for k, v in (case.headers or {}).items()
                        if k.lower() not in OWNED_HEADERS}
        resp = case.call(base_url=base, headers=headers, timeout=30)
        tally.examples[auth] += 1
        tally.statuses[resp.status_code] += 1
        problem = judge(resp, guarded, auth)
        if problem:
            tally.failures.append(f"{op.label} [{auth} key] {problem}: "
                                  f"{case.as_curl_command(headers=headers, base_url=base)}")
    run()


def test_fuzz_every_operation(api_process, capsys):
    base, env = api_process
    from ..api.conftest import new_key

    key = new_key(env["OMNIJOBS_DATABASE_URL"], "fuzz")
    valid = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=base, headers=valid) as client:
        ids = [client.post("/v1/audio/speech", headers={"Prefer": "respond-async"},
                           json={"model": "tts-1", "input": "Fuzz."}).json()["id"],
               client.post("/v1/videos", json={"prompt": "Fuzz.", "seconds": 1}).json()["id"],
               client.post("/v1/webhook_endpoints", json={
                   "name": "fuzz", "url": "http://127.0.0.1:9/hook",
                   "event_types": ["speech.completed"]}).json()["id"]]
    schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
    ops = [result.ok() for result in schema.get_all_operations()]
    tally = Tally()
    for auth, headers in (("valid", valid), ("none", {}),
                          ("wrong", {"Authorization": "Bearer oj-not-a-key"})):
        for op in ops:
            fuzz(op, base, headers, auth, ids, tally)
    line = (f"fuzz: {len(ops)} operations, {sum(tally.examples.values())} examples "
            f"({', '.join(f'{k} key {v}' for k, v in tally.examples.items())}), "
            f"{len(tally.failures)} failures; statuses {dict(sorted(tally.statuses.items()))}")
    with capsys.disabled():
        print("\n" + line)
    assert len(ops) >= 12
    assert not tally.failures, "\n".join(tally.failures[:20])
