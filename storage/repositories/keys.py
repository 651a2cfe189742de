"""Tenants and their API keys. Keys are random, shown once, stored as SHA-256."""

from __future__ import annotations

import hashlib
import secrets
import uuid
from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from ..models import ApiKey, Tenant

KEY_PREFIX = "oj-"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class KeyRepository:
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    def create_key(self, tenant_name: str) -> tuple[str, str]:
        """Create the tenant if needed and a new key for it; returns (tenant_id, key)."""
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        now = datetime.now(UTC)
        with self._sessions.begin() as s:
            tenant = s.scalar(select(Tenant).where(Tenant.name == tenant_name))
            if tenant is None:
                tenant = Tenant(id="ten_" + uuid.uuid4().hex, name=tenant_name, created_at=now)
                s.add(tenant)
                s.flush()
            s.add(ApiKey(id="key_" + uuid.uuid4().hex, tenant_id=tenant.id, prefix=key[:10],
                         key_hash=hash_key(key), created_at=now))
            return tenant.id, key

    def authenticate(self, key: str) -> str | None:
        """Return the tenant id owning an unrevoked key, or None."""
        with self._sessions() as s:
            row = s.execute(select(ApiKey.tenant_id).where(
                ApiKey.key_hash == hash_key(key), ApiKey.revoked_at.is_(None))).first()
            return row[0] if row else None
