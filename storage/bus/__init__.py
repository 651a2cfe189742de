"""Live notices and audio chunks, from workers (and API processes) to API processes.

A notice says "job X changed, read it again": it carries no state, so one that is lost
costs latency, never correctness (the database stays the source of truth, and an API
process re-checks every job it watches on a timer as well). Audio chunks carry the
samples a job adds as it is generated, raw float32, for the API to encode in whatever
format its client asked.
A worker sends chunks only while someone listens (``listen``), so jobs nobody streams
cost one existence check per chunk.

A synchronous wait may also ask for the result itself (``expect_result``): the worker
that completes the job then hands the encoded bytes of a small output (``HANDOFF_MAX_BYTES``)
to the waiting process with the completion, after the output is stored and the job
recorded, so the answer needs neither a database read nor a store GET. The handed result
is a copy of what was stored; a wait that gets none (a lost message, a large output, no
one asked) reads the record and the store as before.

Two transports: Redis in production (storage/bus/redis_bus.py), a spool folder in the
embedded mode (storage/bus/spool.py); both behind the interfaces of storage/bus/base.py.
Everything is re-exported here: callers import ``storage.bus``.
"""

from __future__ import annotations

from core.settings import Settings

from .base import (
    HANDOFF_MAX_BYTES,
    LISTEN_TTL_S,
    UNREAD,
    Bus,
    Chunk,
    Result,
    Subscription,
    Watcher,
)
from .redis_bus import RedisBus, RedisWatcher
from .spool import SpoolBus, SpoolWatcher, prune

__all__ = [
    "HANDOFF_MAX_BYTES", "LISTEN_TTL_S", "UNREAD", "Bus", "Chunk", "RedisBus", "RedisWatcher",
    "Result", "SpoolBus", "SpoolWatcher", "Subscription", "Watcher", "make_bus", "prune",
]


def make_bus(settings: Settings) -> Bus:
    if settings.broker.startswith(("redis://", "rediss://")):
        return RedisBus(settings)
    return SpoolBus(settings.live_dir)
