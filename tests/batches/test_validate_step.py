"""The validation step never leaves a batch ``validating``: a line that breaks the parser
(nested past the recursion limit, longer than the line cap) is an invalid line with its
reason, an unexpected error fails the batch with a reason, and splitting one very long
line costs memory bounded by the cap (embedded mode: SQLite and the local store)."""

from __future__ import annotations

import json
import tracemalloc
import uuid
from datetime import timedelta

import pytest

from api.batch_lines import line_checker
from core.batches import BatchStatus
from core.settings import Settings
from storage.db import make_engine, make_sessionmaker
from storage.records import NewFile
from storage.repositories import KeyRepository
from storage.repositories.files import file_key, new_file_id
from tasks.app import make_celery
from tasks.batch_validate import split_lines, validate_batch
from tasks.batches import finalize_batch
from tasks.runtime import WorkerRuntime

GOOD = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/audio/speech",
                   "body": {"model": "tts-1", "input": "Hello."}}).encode()


@pytest.fixture
def rt(tmp_path, sqlite_url):
    runtime = WorkerRuntime(Settings(home=tmp_path, database_url=sqlite_url))
    runtime.check_line = line_checker(runtime.settings)
    return runtime


def batch_of(rt: WorkerRuntime, sqlite_url: str, data: bytes) -> str:
    tenant = KeyRepository(make_sessionmaker(make_engine(sqlite_url))).create_key(
        "v-" + uuid.uuid4().hex[:8])[0]
    file_id = new_file_id()
    key = file_key(tenant, file_id)
    rt.store.put(key, data, "application/jsonl")
    rt.files.create(NewFile(id=file_id, tenant_id=tenant, purpose="batch", filename="in.jsonl",
                            bytes=len(data), key=key))
    return rt.batches.create(tenant, endpoint="/v1/audio/speech", input_file_id=file_id,
                             completion_window="24h", metadata=None, max_active=10).id


def validated(rt: WorkerRuntime, batch_id: str):
    assert validate_batch(rt, make_celery(rt.settings), batch_id) == 1
    batch = rt.batches.get(batch_id)
    assert batch.status is BatchStatus.FAILED, batch
    return [(e["code"], e["line"]) for e in batch.errors], batch.errors


def test_a_line_nested_past_the_recursion_limit_is_an_invalid_line(rt, sqlite_url):
    deep = b"[" * 100_000 + b"]" * 100_000
    found, errors = validated(rt, batch_of(rt, sqlite_url, GOOD + b"\n" + deep + b"\n"))
    assert found == [("invalid_json_line", 2)]
    assert "RecursionError" in errors[0]["message"]


def test_a_line_over_the_cap_is_an_invalid_line(rt, sqlite_url, monkeypatch):
    monkeypatch.setattr(rt.settings, "batch_max_line_bytes", 4096)
    long = json.dumps({"custom_id": "b", "method": "POST", "url": "/v1/audio/speech",
                       "body": {"model": "tts-1", "input": "x" * 5000}}).encode()
    found, errors = validated(rt, batch_of(rt, sqlite_url, b"\n".join([GOOD, long, GOOD])))
    assert found == [("line_too_long", 2), ("duplicate_custom_id", 3)]
    assert "4096" in errors[0]["message"]


def test_a_body_that_breaks_the_check_is_an_invalid_line(rt, sqlite_url):
    def broken(*_args):
        raise RuntimeError("a bug in a line check")
    rt.check_line = broken
    found, errors = validated(rt, batch_of(rt, sqlite_url, GOOD + b"\n"))
    assert found == [("invalid_line", 1)] and "RuntimeError" in errors[0]["message"]


def test_an_unexpected_error_fails_the_batch_with_a_reason(rt, sqlite_url, monkeypatch):
    batch_id = batch_of(rt, sqlite_url, GOOD + b"\n")

    def broken(*_args, **_kwargs):
        raise KeyError("a bug in expansion")
    monkeypatch.setattr(rt.batches, "expand", broken)
    found, errors = validated(rt, batch_id)
    assert found == [("validation_failed", None)] and "KeyError" in errors[0]["message"]


def test_one_200_mb_line_is_split_in_bounded_memory():
    """A line is never held past the cap, so a 200 MB line streamed in 1 MB blocks costs
    a few blocks of memory, not a copy of everything read so far per block."""
    block = b"x" * (1 << 20)

    def blocks():
        yield GOOD + b"\n"
        for _ in range(200):
            yield block
        yield b"\n" + GOOD

    tracemalloc.start()
    try:
        lines = [line if isinstance(line, bytes) else line.length
                 for line in split_lines(blocks(), max_line_bytes=1 << 20)]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert lines == [GOOD, 200 << 20, GOOD]
    assert peak < 4 << 20, peak


def test_lines_split_across_blocks_are_whole():
    data = b"\n".join([b"one", b"", b"three" * 10, b"four"])
    for size in (1, 2, 3, 7, 64):
        blocks = [data[i:i + size] for i in range(0, len(data), size)]
        assert list(split_lines(blocks, max_line_bytes=100)) == data.split(b"\n")


@pytest.mark.parametrize("policy_s", [7200, None])
def test_result_files_follow_the_batchs_output_expiry(rt, sqlite_url, policy_s):
    tenant = KeyRepository(make_sessionmaker(make_engine(sqlite_url))).create_key(
        "o-" + uuid.uuid4().hex[:8])[0]
    file_id = new_file_id()
    rt.store.put(file_key(tenant, file_id), GOOD + b"\n", "application/jsonl")
    rt.files.create(NewFile(id=file_id, tenant_id=tenant, purpose="batch", filename="in.jsonl",
                            bytes=len(GOOD) + 1, key=file_key(tenant, file_id)))
    batch = rt.batches.create(tenant, endpoint="/v1/audio/speech", input_file_id=file_id,
                              completion_window="24h", metadata=None, max_active=10,
                              output_expires_after_s=policy_s)
    assert validate_batch(rt, make_celery(rt.settings), batch.id) == 1
    assert rt.batches.cancel(batch.id, tenant).status is BatchStatus.CANCELLING
    assert finalize_batch(rt, batch.id, BatchStatus.CANCELLING) == 1
    ended = rt.batches.get(batch.id)
    errors = rt.files.get(ended.error_file_id)
    assert errors.expires_at - errors.created_at == timedelta(
        seconds=policy_s or rt.settings.file_ttl_s)
