"""Every Redis client the service builds, with the same bounds.

A Redis that is down refuses connections and fails fast; one that is frozen (a stopped
process, a host that stopped answering, a partition) accepts them, takes what is sent and
never replies. Without bounds redis-py and kombu then wait for ever, so one frozen Redis
would freeze every thread that touches it. Here every client (the broker connections of
Celery/kombu, the live bus and its notice subscription, the rate limiter) gets the same
options: connect and socket timeouts of ``OMNIJOBS_REDIS_TIMEOUT_S``, no retries of its
own (each caller knows its fallback: the outbox relay, the database resync, failing
open), TCP keepalives, and a health check of connections that sat idle.

``Breaker`` is for the callers on a request path: after one failure they skip Redis for
a few seconds instead of paying the timeout again on every request.
"""

from __future__ import annotations

import socket
import time

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from core.settings import Settings

COOL_OFF_S = 2.0  # after a failure, request paths leave Redis alone this long
# A dead peer that sends no reset is found by the kernel within about 10 + 3 * 5 s.
KEEPALIVE = {opt: value for name, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5),
                                            ("TCP_KEEPCNT", 3))
             if (opt := getattr(socket, name, None)) is not None}
UNAVAILABLE = (redis.ConnectionError, redis.TimeoutError)


def health_check_s(settings: Settings) -> int:
    """A connection idle this long is pinged before it is used again (and kombu checks
    its long-lived consumer connections this often)."""
    return max(1, round(5 * settings.redis_timeout_s))


def client_options(settings: Settings) -> dict:
    """redis-py's connection options; kombu's Redis transport takes the same names."""
    timeout = settings.redis_timeout_s
    return {"socket_timeout": timeout, "socket_connect_timeout": timeout,
            "socket_keepalive": True, "socket_keepalive_options": KEEPALIVE,
            "health_check_interval": health_check_s(settings), "retry_on_timeout": False}


def redis_client(settings: Settings, url: str | None = None) -> redis.Redis:
    return redis.Redis.from_url(url or settings.broker, retry=Retry(NoBackoff(), 0),
                                **client_options(settings))


def async_redis_client(settings: Settings, url: str | None = None):
    """For a subscription that checks its own health (``storage/bus.py``): no automatic
    health-check pings, whose answers it could not see."""
    import redis.asyncio as aioredis

    options = client_options(settings) | {"health_check_interval": 0}
    return aioredis.Redis.from_url(url or settings.broker, retry=Retry(NoBackoff(), 0),
                                   **options)


class Breaker:
    """``with breaker:`` around a Redis call on a request path. A call that fails for
    want of Redis opens the breaker; while it is open, calls fail at once with
    ``redis.ConnectionError`` for ``COOL_OFF_S``, so a frozen Redis costs one bounded
    wait per process every few seconds, not one per request."""

    def __init__(self, cool_off_s: float = COOL_OFF_S) -> None:
        self.cool_off_s = cool_off_s
        self._open_until = 0.0

    def __enter__(self) -> Breaker:
        if time.monotonic() < self._open_until:
            raise redis.ConnectionError("Redis unavailable (not retried for a few seconds "
                                        "after a failure)")
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None and issubclass(exc_type, UNAVAILABLE):
            self._open_until = time.monotonic() + self.cool_off_s
