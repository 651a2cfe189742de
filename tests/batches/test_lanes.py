"""Lanes in the embedded broker (the filesystem transport with lanes) and the bulk
publisher's messages on Redis, as Celery's own ``send_task`` would write them."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import redis
from kombu import Connection, Queue

from core.settings import Settings
from storage.records import OutboxRecord
from tasks.app import make_celery
from tasks.dispatch import BULK_PRIORITY, RENDER_TASK, publish
from tasks.lanes import publish_bulk

from ..services import redis_db


@pytest.fixture
def folder_app(tmp_path: Path):
    return make_celery(Settings(home=tmp_path), with_tasks=False)


def take(app, queues: list[str], count: int) -> list[str]:
    """Job ids in the order a consumer of ``queues`` receives them."""
    got: list[str] = []
    with Connection(app.conf.broker_url, transport=app.conf.broker_transport,
                    transport_options=app.conf.broker_transport_options) as conn:
        def received(body, message):
            got.append(body[0][0])
            message.ack()
        with conn.Consumer([Queue(q) for q in queues], callbacks=[received],
                           accept=["json"]):
            while len(got) < count:
                conn.drain_events(timeout=5)
    return got


def test_the_embedded_broker_serves_interactive_jobs_before_bulk_ones(folder_app):
    publish_bulk(folder_app, [(f"bulk-{i}", "pipeline.a", "t") for i in range(5)]
                 + [("bulk-b", "pipeline.b", "t")])
    for job_id, queue in (("now-a", "pipeline.a"), ("now-b", "pipeline.b")):
        publish(folder_app, OutboxRecord(0, "render", job_id, queue, {"job_id": job_id},
                                         available_at=_past()))
    # Interactive first on every queue it serves, then the bulk lane oldest first.
    assert take(folder_app, ["pipeline.a", "pipeline.b"], 8) == [
        "now-a", "now-b", *(f"bulk-{i}" for i in range(5)), "bulk-b"]


def test_a_relayed_bulk_message_stays_in_the_bulk_lane(folder_app):
    publish(folder_app, OutboxRecord(0, "render", "later", "pipeline.a",
                                     {"job_id": "later", "lane": "bulk"}, available_at=_past()))
    publish(folder_app, OutboxRecord(0, "render", "now", "pipeline.a", {"job_id": "now"},
                                     available_at=_past()))
    assert take(folder_app, ["pipeline.a"], 2) == ["now", "later"]


class _PausingFile:
    """A message file whose write stops halfway while ``look`` reads the folder, as a
    consumer might at that moment."""

    def __init__(self, f, look) -> None:
        self.f, self.look = f, look

    def write(self, data: bytes) -> None:
        half = len(data) // 2
        self.f.write(data[:half])
        self.f.flush()
        self.look()
        self.f.write(data[half:])

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.f.close()


def test_the_embedded_broker_never_shows_a_half_written_message(folder_app, tmp_path,
                                                                monkeypatch):
    """Every write pauses halfway while a reader lists the folder and reads each message
    it can see: each one must be whole (a message written in place would be seen half
    written by the very reader that looks at it)."""
    folder = Settings(home=tmp_path).broker_folder
    pauses, seen = [], []

    def look() -> None:
        pauses.append(1)
        seen.extend((p.name, p.read_bytes()) for p in folder.iterdir()
                    if p.name.endswith(".msg"))

    real_open = open
    monkeypatch.setattr("tasks.lanes.open", lambda path, mode="r", *a, **kw: _PausingFile(
        real_open(path, mode, *a, **kw), look), raising=False)
    publish_bulk(folder_app, [(f"bulk-{i}", "pipeline.a", "t") for i in range(50)])
    assert len(pauses) == 50  # every message was written through the pause
    for name, data in seen:
        assert json.loads(data)["headers"]["task"] == RENDER_TASK, f"{name} half written"
    assert len(seen) == sum(range(50))  # the reader saw each finished one, no other
    names = [p.name for p in folder.iterdir() if p.is_file()]
    assert len(names) == 50 and all(n.startswith("p9-") and n.endswith(".pipeline.a.msg")
                                    for n in names)


def test_bulk_messages_are_celerys_own_in_the_lowest_priority_list(tmp_path):
    with redis_db() as url:
        app = make_celery(Settings(home=tmp_path, broker_url=url), with_tasks=False)
        publish_bulk(app, [(f"job_{i:032x}", "pipeline.x", f"token-{i}") for i in range(2500)])
        client = redis.Redis.from_url(url)
        assert client.llen("pipeline.x") == 0
        assert client.llen(f"pipeline.x\x06\x16{BULK_PRIORITY}") == 2500
        ours = json.loads(client.lindex(f"pipeline.x\x06\x16{BULK_PRIORITY}", -1))
        publish(app, OutboxRecord(0, "render", "job_ref", "pipeline.y", {"job_id": "job_ref"},
                                  available_at=_past()))
        theirs = json.loads(client.lindex("pipeline.y", 0))
        assert ours["headers"]["task"] == theirs["headers"]["task"] == RENDER_TASK
        assert set(ours["headers"]) == set(theirs["headers"])
        assert ours["headers"]["id"] == ours["properties"]["correlation_id"] != theirs["headers"][
            "id"]
        assert ours["properties"]["priority"] == BULK_PRIORITY
        assert (ours["content-type"], ours["properties"]["delivery_info"]["routing_key"]) == (
            theirs["content-type"], "pipeline.x")
        ids = {json.loads(m)["headers"]["id"] for m in client.lrange(
            f"pipeline.x\x06\x16{BULK_PRIORITY}", 0, -1)}
        assert len(ids) == 2500  # a task id of its own each
        body = json.loads(base64.b64decode(ours["body"]))
        assert body[0] == ["job_" + "0" * 32, "token-0"]  # the job and its dispatch token


def _past():
    from datetime import UTC, datetime

    return datetime(2000, 1, 1, tzinfo=UTC)
