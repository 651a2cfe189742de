"""The production bus, on the Redis broker.

Production (a Redis broker): a notice is a ``PUBLISH`` on ``omnijobs:live:<job>``, and
each API process holds one pattern subscription for all of them (``RedisWatcher``) plus
a channel of its own (its inbox), named in ``omnijobs:wait:<job>`` by a wait that expects
the result, where only that process receives the result's bytes; a
listened-to job's chunks go to a Redis Stream ``omnijobs:audio:<job>`` (capped, expiring)
that readers page through by entry id, so a reader that starts late loses nothing.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

import numpy as np

from core.settings import Settings

from .base import HANDOFF_MAX_BYTES, LISTEN_TTL_S, Bus, Chunk, Result, Watcher

log = logging.getLogger(__name__)

NOTICE = "omnijobs:live:"
AUDIO = "omnijobs:audio:"
LISTEN = "omnijobs:listen:"
WAIT = "omnijobs:wait:"
INBOX = "omnijobs:inbox:"
RUNNING = b"running"  # a notice's body: the job runs on (claim, progress, audio); else b"1"
AUDIO_TTL_S = 600  # a stream's chunks outlive its last chunk by this much
AUDIO_MAXLEN = 20_000


class RedisBus(Bus):
    """Every call bounded (storage/redisconn.py), and skipped for a moment after Redis
    failed: callers treat a failed notice or chunk as they treat a lost one."""

    def __init__(self, settings: Settings) -> None:
        from ..redisconn import Breaker, redis_client

        self.settings = settings
        self._client = redis_client(settings)
        self._breaker = Breaker()
        self.inbox = INBOX + uuid.uuid4().hex  # this process's own channel (its watcher's)

    def notify(self, job_id: str, running: bool = False) -> None:
        with self._breaker:
            self._client.publish(NOTICE + job_id, RUNNING if running else b"1")

    def expect_result(self, job_id: str, ttl_s: float) -> None:
        with self._breaker:
            self._client.set(WAIT + job_id, self.inbox, ex=max(1, int(ttl_s) + 1))

    def hand_result(self, result: Result) -> bool:
        if len(result.data) > HANDOFF_MAX_BYTES:
            return False
        with self._breaker:
            inbox = self._client.get(WAIT + result.job_id)
            if inbox is None:
                return False
            self._client.publish(inbox, result.encode())
        return True

    def listen(self, job_id: str) -> None:
        with self._breaker:
            self._client.set(LISTEN + job_id, b"1", ex=LISTEN_TTL_S)

    def listening(self, job_id: str) -> bool:
        with self._breaker:
            return bool(self._client.exists(LISTEN + job_id))

    def add_audio(self, job_id: str, attempt: int, seq: int, samples: np.ndarray,
                  sample_rate: int) -> None:
        data = np.ascontiguousarray(samples, dtype=np.float32)
        pipe = self._client.pipeline(transaction=False)
        pipe.xadd(AUDIO + job_id, {"a": attempt, "r": sample_rate, "c": data.shape[0],
                                   "d": data.tobytes()}, maxlen=AUDIO_MAXLEN, approximate=True)
        pipe.expire(AUDIO + job_id, AUDIO_TTL_S)
        pipe.publish(NOTICE + job_id, RUNNING)
        with self._breaker:
            pipe.execute()

    def read_audio(self, job_id: str, after: str) -> list[Chunk]:
        start = f"({after}" if after else "-"
        with self._breaker:
            entries = self._client.xrange(AUDIO + job_id, min=start)
        chunks = []
        for entry_id, f in entries:
            channels = int(f[b"c"])
            samples = np.frombuffer(f[b"d"], dtype=np.float32).reshape(channels, -1)
            chunks.append(Chunk(entry_id.decode(), int(f[b"a"]), samples, int(f[b"r"])))
        return chunks

    def watcher(self) -> Watcher:
        return RedisWatcher(self.settings, self.inbox)

class RedisWatcher(Watcher):
    """One pattern subscription per event loop. A subscription can go quiet without
    closing (a frozen Redis, a half-open connection), so after ``health_check_s`` of
    silence it is pinged, and one that does not answer within as long again is dropped
    and made again (a busy host is not taken for a dead one); meanwhile the watchers'
    database resync carries on."""

    def __init__(self, settings: Settings, inbox: str | None = None) -> None:
        super().__init__()
        self.settings, self.inbox = settings, inbox

    async def _run(self) -> None:
        from ..redisconn import async_redis_client

        while True:
            client = async_redis_client(self.settings)
            try:
                async with client.pubsub() as pubsub:
                    if self.inbox is not None:
                        await pubsub.subscribe(self.inbox)
                    await pubsub.psubscribe(NOTICE + "*")
                    await self._listen(pubsub)
            except asyncio.CancelledError:
                raise
            except Exception:  # Redis away: watchers fall back on their resync timers
                log.warning("live notices: Redis subscription lost; reconnecting",
                            exc_info=True)
                await asyncio.sleep(1.0)
            finally:
                await client.aclose()

    async def _listen(self, pubsub) -> None:
        from ..redisconn import health_check_s

        quiet_s = health_check_s(self.settings)
        while True:
            msg = await pubsub.get_message(timeout=quiet_s)
            if msg is None:  # quiet for a while: is anyone there?
                await pubsub.ping()
                msg = await pubsub.get_message(timeout=quiet_s)
                if msg is None:
                    raise TimeoutError(f"no answer from Redis in {quiet_s:g}s")
            if msg["type"] == "pmessage":
                self.wake(msg["channel"].decode()[len(NOTICE):], msg["data"] == RUNNING)
            elif msg["type"] == "message":
                self._handed(msg["data"])
            elif msg["type"] == "psubscribe":
                self.wake_all()  # (subscribed again) anything sent meanwhile is re-read


    def _handed(self, raw: bytes) -> None:
        try:
            result = Result.decode(raw)
        except (ValueError, KeyError, TypeError):  # not ours to read: the notice follows
            log.warning("live notices: unreadable result message dropped")
            return
        self.hand(result)
