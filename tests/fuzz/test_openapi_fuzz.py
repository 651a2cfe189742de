"""Schemathesis over ``/openapi.json`` against a real API process: every operation, with
a valid key, with no key and with a wrong key, a bounded number of examples each.

Passes when no answer is a 5xx, every 4xx has OpenAI's error shape, and a key-guarded
operation answers 401 to a request without a valid key. Prints one line of counts.

Besides the schema's own examples, every operation gets cases with one string (a body
value or key, a query value) carrying a control character or a NUL,
both in generated requests and in requests that are valid but for that one character
(a real endpoint's update, a speech job whose webhook URL is a literal public address):
random strings almost never hold those, and a NUL is where a database turns a bad
request into a server error.
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
ID_PARAMS = ("job_id", "video_id", "endpoint_id", "file_id")
# CI replays the same examples every run (a red build names a regression, not a lucky
# draw); elsewhere every run draws new ones, and longer runs explore further.
CI = os.environ.get("CI") == "true"
OWNED_HEADERS = {"authorization", "content-length", "transfer-encoding", "host"}
# (lone surrogates are left to tests/api/test_control_characters.py: schemathesis itself
# cannot carry them)
BAD_CHARACTERS = ("\x00", "\x01", "\x08", "\x0b", "\x1b", "\x7f", "\x85")
PUBLIC_URL = "http://93.184.216.34/hook"  # a literal public address: no DNS lookup
# Valid requests (but for the one character the fuzz puts in), per operation; "{file_id}"
# is replaced by the file made at set-up, path ids by the real ones.
VALID_BODIES: dict[str, list[dict]] = {
    "POST /v1/audio/speech": [{"model": "tts-1", "input": "Fuzz.", "voice": "joe",
                               "metadata": {"k": "v"}, "webhook_url": PUBLIC_URL}],
    "POST /v1/videos": [{"prompt": "Fuzz.", "seconds": 1, "negative_prompt": "blur",
                         "metadata": {"k": "v"}, "webhook_url": PUBLIC_URL}],
    "POST /v1/webhook_endpoints": [{"name": "fuzz", "url": "http://127.0.0.1:9/hook",
                                    "event_types": ["speech.completed"]}],
    "POST /v1/webhook_endpoints/{endpoint_id}": [{"name": "fuzz"},
                                                 {"url": "http://127.0.0.1:9/hook"}],
    "POST /v1/webhook_endpoints/{endpoint_id}/test": [{"event_type": "speech.completed"}],
    "POST /v1/batches": [{"input_file_id": "{file_id}", "endpoint": "/v1/audio/speech",
                          "completion_window": "24h", "metadata": {"k": "v"}}],
}


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


def _strings(value, path=()) -> Iterator[tuple]:
    """Where a string sits in a JSON value: (path, is a key) for each one; the body's
    own keys are field names (an unknown one is a plain 400) and are left out."""
    if isinstance(value, str):
        yield path, False
    elif isinstance(value, dict):
        for k, v in value.items():
            if path:
                yield path + (k,), True
            yield from _strings(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _strings(v, path + (i,))


def _tainted(value, path: tuple, is_key: bool, bad: str, at: int):
    """A copy of ``value`` with ``bad`` put into the string at ``path``."""
    def put(text: str) -> str:
        i = at % (len(text) + 1)
        return text[:i] + bad + text[i:]

    if not path:
        return put(value)
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        if is_key and not rest:
            return {(put(k) if k == head else k): v for k, v in value.items()}
        return {k: (_tainted(v, rest, is_key, bad, at) if k == head else v)
                for k, v in value.items()}
    return [(_tainted(v, rest, is_key, bad, at) if i == head else v)
            for i, v in enumerate(value)]


def taint(case, bad: str, which: int, at: int):
    """The case with one of its strings (body or query) carrying ``bad``."""
    slots = [("body", p, k) for p, k in _strings(case.body)] if isinstance(
        case.body, (dict, list, str)) else []
    slots += [("query", p, k) for p, k in _strings(case.query or {})]
    if not slots:
        return case
    part, path, is_key = slots[which % len(slots)]
    if part == "body":
        case.body = _tainted(case.body, path, is_key, bad, at)
    else:
        case.query = _tainted(case.query, path, is_key, bad, at)
    return case


def _with_bad_characters(cases):
    return st.tuples(cases, st.sampled_from(BAD_CHARACTERS), st.integers(0, 1 << 16),
                     st.integers(0, 1 << 16)).map(lambda t: taint(*t))


def strategies(op, ids: dict[str, str]):
    modes = [op.as_strategy(generation_mode=m)
             for m in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)]
    names = {p.name for p in op.path_parameters}
    for name in names & set(ID_PARAMS):  # real ids too, to get past the lookup
        modes += [op.as_strategy(path_parameters={name: i}) for i in ids.values()]
        modes.append(_with_bad_characters(op.as_strategy(
            path_parameters={name: ids[name]})))
    modes.append(_with_bad_characters(op.as_strategy()))
    return st.one_of(modes)


def one_bad_character(op, ids: dict[str, str]) -> Iterator:
    """Every valid request of the operation (with real ids) with each of its strings in
    turn carrying each bad character: a sweep, since a random draw rarely lands on the
    one field (of one valid request) that reaches a text column."""
    path = {n: ids[n] for n in {p.name for p in op.path_parameters} & set(ids)}
    for template in VALID_BODIES.get(op.label, []):
        body = json.loads(json.dumps(template).replace("{file_id}", ids["file_id"]))
        for which in range(len(list(_strings(body)))):
            for bad in BAD_CHARACTERS:
                for at in (1, -1):  # inside, and at the end (past a URL's host)
                    yield taint(op.Case(body=body, path_parameters=path,
                                        media_type="application/json"), bad, which, at)


def send(op, case, base: str, headers: dict[str, str], auth: str, tally: Tally) -> None:
    # The key is ours to set; framing headers belong to the HTTP client (a generated
    # Content-Length is refused by the HTTP server before the app sees the request).
    case.headers = {k: v for k, v in (case.headers or {}).items()
                    if k.lower() not in OWNED_HEADERS}
    resp = case.call(base_url=base, headers=headers, timeout=30)
    tally.examples[auth] += 1
    tally.statuses[resp.status_code] += 1
    problem = judge(resp, bool(op.definition.raw.get("security")), auth)
    if problem:
        tally.failures.append(f"{op.label} [{auth} key] {problem}: "
                              f"{case.as_curl_command(headers=headers, base_url=base)}")


def fuzz(op, cases, base: str, headers: dict[str, str], auth: str, ids: dict[str, str],
         tally: Tally) -> None:
    @settings(max_examples=EXAMPLES[auth], deadline=None, database=None, derandomize=CI,
              phases=[Phase.explicit, Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=cases)
    def run(case) -> None:
        send(op, case, base, headers, auth, tally)
    run()
    if auth == "valid":
        for case in one_bad_character(op, ids):
            send(op, case, base, headers, auth, tally)


def test_fuzz_every_operation(api_process, capsys):
    base, env = api_process
    from ..api.conftest import new_key

    key = new_key(env["OMNIJOBS_DATABASE_URL"], "fuzz")
    valid = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=base, headers=valid) as client:
        ids = {"job_id": client.post("/v1/audio/speech", headers={"Prefer": "respond-async"},
                                     json={"model": "tts-1", "input": "Fuzz."}).json()["id"],
               "video_id": client.post("/v1/videos", json={"prompt": "Fuzz.",
                                                           "seconds": 1}).json()["id"],
               "endpoint_id": client.post("/v1/webhook_endpoints", json={
                   "name": "fuzz", "url": "http://127.0.0.1:9/hook",
                   "event_types": ["speech.completed"]}).json()["id"],
               "file_id": client.post("/v1/files", data={"purpose": "batch"}, files={
                   "file": ("in.jsonl", b"{}\n", "application/jsonl")}).json()["id"]}
    schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
    ops = [result.ok() for result in schema.get_all_operations()]
    tally = Tally()
    # One strategy per operation for all three keys: hypothesis validates a strategy
    # the first time it draws from it, and that was a sixth of this test's CPU.
    cases = {op.label: strategies(op, ids) for op in ops}
    for auth, headers in (("valid", valid), ("none", {}),
                          ("wrong", {"Authorization": "Bearer oj-not-a-key"})):
        for op in ops:
            fuzz(op, cases[op.label], base, headers, auth, ids, tally)
    line = (f"fuzz: {len(ops)} operations, {sum(tally.examples.values())} examples "
            f"({', '.join(f'{k} key {v}' for k, v in tally.examples.items())}), "
            f"{len(tally.failures)} failures; statuses {dict(sorted(tally.statuses.items()))}")
    with capsys.disabled():
        print("\n" + line)
    assert len(ops) >= 12
    assert not tally.failures, "\n".join(tally.failures[:20])
