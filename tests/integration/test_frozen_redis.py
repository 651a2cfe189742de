"""A Redis that accepts connections but never answers (a redis-server of our own, frozen
with SIGSTOP) fails every client's call within OMNIJOBS_REDIS_TIMEOUT_S: the broker's
publishes (API and maintenance side), the live bus, the rate limiter. Nothing waits on it
for ever, and the long-lived notice subscription comes back by itself after a connection
that went silent for good."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import numpy as np
import pytest

from api.ratelimit import make_rate_limiter
from core.errors import ServiceUnavailable
from core.settings import Settings
from storage.bus import make_bus
from storage.records import OutboxRecord
from tasks.app import make_celery
from tasks.dispatch import publish
from tasks.publish import publish_many

from ..proxy import Proxy
from ..services import RedisServer
from ..services import outcome as answered

TIMEOUT_S = 0.2  # the bound under test; every call below must give up long before:
DEADLINE_S = 10.0  # fifty times the bound (and shorter than any retry loop without it)


@pytest.fixture
def server(tmp_path) -> Iterator[RedisServer]:
    redis = RedisServer(tmp_path / "redis").start()
    yield redis
    redis.stop()  # thaws it first


def bounded(url: str, **extra) -> Settings:
    return Settings(mode="embedded", broker_url=url, redis_timeout_s=TIMEOUT_S, **extra)


def outcome(call: Callable[[], object]) -> object:
    return answered(call, DEADLINE_S, "a call to a frozen Redis")


def message() -> OutboxRecord:
    return OutboxRecord(id=1, topic="render", job_id="job_" + "0" * 32, queue="piper-joe",
                        payload={"token": "t"}, available_at=datetime.now(UTC))


@pytest.mark.parametrize("side", ["api", "maintenance"])
def test_a_publish_to_a_frozen_broker_gives_up(server, side):
    """The API's group publish and the relay's (and the webhook dispatch's) single
    publish: a ServiceUnavailable, so the outbox keeps the message for the relay."""
    app = make_celery(bounded(server.url), with_tasks=side != "api")
    try:
        assert outcome(lambda: publish_many(app, [message()])) is None  # answered: sent
        server.freeze()
        send = ((lambda: publish_many(app, [message()])) if side == "api"
                else (lambda: publish(app, message())))
        assert isinstance(outcome(send), ServiceUnavailable)
    finally:
        server.thaw()
        app.close()


def test_the_live_bus_gives_up_on_a_frozen_redis(server):
    import redis

    bus = make_bus(bounded(server.url))
    job_id = "job_" + "1" * 32
    bus.listen(job_id)
    server.freeze()
    calls = {
        "notify": lambda: bus.notify(job_id),
        "listen": lambda: bus.listen(job_id),
        "listening": lambda: bus.listening(job_id),
        "add_audio": lambda: bus.add_audio(job_id, 1, 0, np.zeros((1, 160), np.float32),
                                           16000),
        "read_audio": lambda: bus.read_audio(job_id, ""),
    }
    for name, call in calls.items():
        assert isinstance(outcome(call), redis.RedisError), name


def test_the_rate_limiter_fails_open_then_stops_asking(server):
    """A submit is not held by a frozen Redis: the limit is not applied, and for a short
    while after a failure Redis is not asked at all (so a freeze costs one bounded wait
    per API process, not one per submit)."""
    limiter = make_rate_limiter(bounded(server.url, tenant_submits_per_s=5.0))
    assert limiter.wait_s("t") == 0.0
    server.freeze()
    assert outcome(lambda: limiter.wait_s("t")) == 0.0
    asked: list[str] = []
    take = limiter._take

    def recording(*args, **kwargs):
        asked.append("take")
        return take(*args, **kwargs)

    limiter._take = recording
    assert outcome(lambda: limiter.wait_s("t")) == 0.0
    assert asked == []  # cooling off: Redis was not asked


def test_notices_come_back_after_the_subscription_went_silent(server):
    """The notice subscription's connection stops carrying anything, without closing (a
    half-open connection after a partition): the watcher's health check notices, and it
    subscribes again, so notices reach waiting requests again."""
    proxy = Proxy(server.port)
    sender = make_bus(bounded(server.url))
    watcher = make_bus(bounded(f"redis://127.0.0.1:{proxy.port}/0")).watcher()
    job_id = "job_" + "2" * 32

    async def notified(sub) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 3 * DEADLINE_S
        while loop.time() < deadline:
            sender.notify(job_id)
            if await sub.wait(0.2):
                return True
        return False

    async def run() -> None:
        with watcher.subscribe(job_id) as sub:
            assert await notified(sub)
            proxy.stall()
            proxy.restore(drop_stalled=True)
            sub.event.clear()
            assert await notified(sub), "the watcher never subscribed again"

    try:
        asyncio.run(run())
    finally:
        proxy.close()


def test_a_worker_whose_ack_timed_out_takes_the_next_message(server):
    """A late ack that a frozen Redis never answers must not leave the message counted
    against the prefetch of 1 for ever (kombu forgets a delivered message only once Redis
    confirms its ack): after SIGCONT the worker's channel takes the next message. The
    unconfirmed one stays in Redis's unacked set, restored after the visibility timeout,
    where its claim finds the job taken."""
    app = make_celery(bounded(server.url), with_tasks=True)
    try:
        with app.connection_for_read() as conn:
            channel = conn.default_channel
            channel.basic_qos(prefetch_count=1)
            queue = channel.queue_declare("acks").queue
            producer = conn.Producer(channel)
            producer.publish({"n": 1}, routing_key=queue)
            message = outcome(lambda: channel.basic_get(queue, no_ack=False))
            assert message is not None and not channel.qos.can_consume()
            server.freeze()
            failed = outcome(lambda: message.ack())
            server.thaw()
            assert isinstance(failed, Exception), failed  # Redis never confirmed it
            assert channel.qos.can_consume()  # ... and the channel takes the next one
    finally:
        server.thaw()
        app.close()
