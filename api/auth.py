"""API key -> tenant, cached for a few seconds so the hot path rarely touches the
database, and never longer: a revoked key stops working on every API process within
the cache's time to live (``OMNIJOBS_AUTH_CACHE_TTL_S``, at most 10 s)."""

from __future__ import annotations

import hashlib
import time

from core.errors import AuthenticationFailed
from storage.repositories import KeyRepository

MAX_ENTRIES = 10_000


def bearer_key(authorization: str | None) -> str:
    scheme, _, key = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise AuthenticationFailed("missing bearer API key (Authorization: Bearer <key>)")
    return key.strip()


class Authenticator:
    def __init__(self, keys: KeyRepository, ttl_s: float) -> None:
        self._keys = keys
        self._ttl_s = ttl_s
        self._cache: dict[str, tuple[str, float]] = {}  # sha256(key) -> (tenant, until)

    def cached(self, key: str) -> str | None:
        """The tenant if this key was checked less than the TTL ago (no I/O)."""
        hit = self._cache.get(_digest(key))
        if hit is not None and hit[1] > time.monotonic():
            return hit[0]
        return None

    def tenant_for(self, key: str) -> str:
        """Look the key up (blocking: call it from a worker thread). Only successes are
        cached, so a wrong key costs a lookup each time and a new key works at once."""
        tenant = self._keys.authenticate(key)
        if tenant is None:
            raise AuthenticationFailed("invalid API key")
        if len(self._cache) >= MAX_ENTRIES:
            self._cache.clear()
        if self._ttl_s > 0:
            self._cache[_digest(key)] = (tenant, time.monotonic() + self._ttl_s)
        return tenant


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()
