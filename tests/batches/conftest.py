"""The batch tests' own deployment: API, a render worker and the maintenance process (the
batch step, webhook deliveries) over their own database, Redis database and bucket,
sharing the session's SeaweedFS. Its own so that bulk queues never reach another test's
workers."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest
from openai import OpenAI
from sqlalchemy import create_engine, text

from ..conftest import migrated_database, stack_env
from ..services import Process, Stack, free_port, redis_url, spawn, wait_until
from ..webhooks.receiver import Receiver

RENDERED = ["piper-joe", "reference-t2va", "test-video", "test-silent", "test-video-slow"]
ENABLED = [*RENDERED, "test-slow", "test-lane"]  # test-slow: enabled, never rendered here
MAX_FILE_BYTES = 4 << 20


@pytest.fixture(scope="package")
def batch_stack(seaweedfs, tmp_path_factory) -> Iterator[Stack]:
    home = tmp_path_factory.mktemp("batch-stack")
    db = migrated_database()
    env = stack_env(next(db), redis_url(), seaweedfs, home,
                    OMNIJOBS_PIPELINES=json.dumps(ENABLED),
                    OMNIJOBS_PIPELINE_MODULES='["tests.fake_pipelines", "tests.batches.pipelines"]',
                    OMNIJOBS_BATCH_MAX_FILE_BYTES=str(MAX_FILE_BYTES),
                    OMNIJOBS_WEBHOOK_ALLOWED_NETWORKS='["127.0.0.0/8"]')
    port = free_port()
    st = Stack(base_url=f"http://127.0.0.1:{port}", env=env)
    try:
        st.processes["api"] = spawn("api", ["api", "--port", str(port)], env, home)
        st.processes["render"] = spawn("render", ["worker", *(
            a for p in RENDERED for a in ("--pipeline", p))], env, home)
        st.processes["maintenance"] = spawn("maintenance", ["maintenance"], env, home)
        wait_until(lambda: httpx.get(f"{st.base_url}/readyz", timeout=2).status_code == 200,
                   60, "API")
        for name in ("render", "maintenance"):
            wait_until(lambda n=name: "ready" in st.processes[n].log.read_text(), 90, name)
        yield st
    finally:
        st.stop()
        next(db, None)


def start_worker(st: Stack, name: str, *pipelines: str) -> Process:
    proc = spawn(name, ["worker", *(a for p in pipelines for a in ("--pipeline", p))],
                 st.env, st.processes["api"].log.parent)
    st.processes[name] = proc
    wait_until(lambda: "ready" in proc.log.read_text(), 90, name)
    return proc


@pytest.fixture(scope="package")
def key(batch_stack) -> str:
    return batch_stack.new_key("bulk")


@pytest.fixture(scope="package")
def client(batch_stack, key) -> Iterator[httpx.Client]:
    with batch_stack.client(key) as c:
        yield c


@pytest.fixture(scope="package")
def sdk(batch_stack, key) -> OpenAI:
    return OpenAI(base_url=batch_stack.base_url + "/v1", api_key=key, max_retries=0)


@pytest.fixture(scope="package")
def db(batch_stack) -> Iterator:
    """The stack's database, for what no API shows (claim order) or a clock can't wait
    for (a completion window passing)."""
    url = batch_stack.env["OMNIJOBS_DATABASE_URL"].replace("postgresql://",
                                                           "postgresql+psycopg://")
    engine = create_engine(url)
    yield engine
    engine.dispose()


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def jsonl(lines: list[dict]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def speech_line(custom_id: str, **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/audio/speech",
            "body": {"model": "tts-1", "voice": "alloy", "response_format": "wav", **body}}


def video_line(custom_id: str, **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/videos",
            "body": {"model": "test-video", "prompt": "ok", **body}}


def wait_batch(sdk: OpenAI, batch_id: str, until=lambda b: b.status in {
        "completed", "failed", "expired", "cancelled"}, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = sdk.batches.retrieve(batch_id)
        if until(batch):
            return batch
        time.sleep(0.3)
    raise AssertionError(f"batch {batch_id} did not get there in {timeout}s: {batch}")


def results(sdk: OpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(line) for line in sdk.files.content(file_id).text.splitlines()]


def batch_jobs(db, batch_id: str) -> dict[str, int]:
    with db.connect() as conn:
        return dict(conn.execute(text(
            "SELECT status, count(*) FROM jobs WHERE batch_id = :b GROUP BY status"),
            {"b": batch_id}).all())
