"""Per-tenant submit rate limits: a token bucket per tenant, shared by every API process
through Redis in production, held in the process in the embedded mode.

If Redis cannot be reached, or does not answer within OMNIJOBS_REDIS_TIMEOUT_S, the limit
is not applied (and a warning logged), and Redis is left alone for a few seconds: submits
must keep working through a broker outage, which the outbox exists for.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

from core.settings import Settings

log = logging.getLogger(__name__)

KEY = "omnijobs:submits:{tenant}"
WARN_EVERY_S = 60.0

# KEYS[1] bucket; ARGV rate, burst. Returns the seconds to wait ("0" when admitted),
# as a string so Redis keeps the fraction. The clock is Redis's, shared by all callers.
TAKE = """
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local b = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens, ts = tonumber(b[1]) or burst, tonumber(b[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - ts) * rate)
local wait = 0
if tokens >= 1 then tokens = tokens - 1 else wait = (1 - tokens) / rate end
redis.call('HSET', KEYS[1], 'tokens', tokens, 'ts', now)
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
return tostring(wait)
"""


class RateLimiter(Protocol):
    def wait_s(self, tenant_id: str) -> float:
        """Take one submit from the tenant's bucket: 0 if admitted, else the seconds
        until one would be."""


class NoLimit:
    blocking = False  # no I/O: the event loop may ask it directly

    def wait_s(self, tenant_id: str) -> float:
        return 0.0


class LocalBuckets:
    """Buckets in this process (the embedded mode runs one API process)."""

    blocking = False

    def __init__(self, rate: float, burst: int) -> None:
        self._rate, self._burst = rate, burst
        self._buckets: dict[str, tuple[float, float]] = {}  # tenant -> (tokens, at)
        self._lock = threading.Lock()

    def wait_s(self, tenant_id: str) -> float:
        now = time.monotonic()
        with self._lock:
            tokens, at = self._buckets.get(tenant_id, (self._burst, now))
            tokens = min(self._burst, tokens + (now - at) * self._rate)
            wait = 0.0 if tokens >= 1 else (1 - tokens) / self._rate
            self._buckets[tenant_id] = (tokens - 1 if wait == 0 else tokens, now)
            return wait


class RedisBuckets:
    """Buckets in Redis, updated atomically by one script per submit."""

    blocking = True  # a network round trip: asked from a worker thread

    def __init__(self, settings: Settings, rate: float, burst: int) -> None:
        import redis

        from storage.redisconn import Breaker, redis_client

        self._errors = redis.RedisError
        self._client = redis_client(settings)
        self._breaker = Breaker()  # a frozen Redis: one bounded wait every few seconds
        self._take = self._client.register_script(TAKE)
        self._rate, self._burst = rate, burst
        self._warned_at = -WARN_EVERY_S

    def wait_s(self, tenant_id: str) -> float:
        try:
            with self._breaker:
                return float(self._take(keys=[KEY.format(tenant=tenant_id)],
                                        args=[self._rate, self._burst]))
        except self._errors as exc:
            if time.monotonic() - self._warned_at >= WARN_EVERY_S:
                self._warned_at = time.monotonic()
                log.warning("rate limiter unavailable (%s); submits not limited",
                            type(exc).__name__)
            return 0.0


def make_rate_limiter(settings: Settings) -> RateLimiter:
    rate, burst = settings.submit_rate
    if rate <= 0:
        return NoLimit()
    if settings.broker.startswith(("redis://", "rediss://")):
        return RedisBuckets(settings, rate, burst)
    return LocalBuckets(rate, burst)
