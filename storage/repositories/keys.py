"""Tenants and their API keys. Keys are random, shown once, stored as SHA-256."""

from __future__ import annotations

import hashlib
import secrets
import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from core.errors import InvalidRequest, NotFound

from ..models import ApiKey, Tenant
from ..records import KeyRecord

KEY_PREFIX = "oj-"
PREFIX_CHARS = 10  # kept in clear to name a key in listings and revocations
LAST_USED_EVERY = timedelta(minutes=1)  # at most one write per key per process per minute


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _record(key: ApiKey, tenant: str) -> KeyRecord:
    return KeyRecord(prefix=key.prefix, tenant=tenant, created_at=key.created_at,
                     last_used_at=key.last_used_at, revoked_at=key.revoked_at)


class KeyRepository:
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    def create_key(self, tenant_name: str, operator: bool = False) -> tuple[str, str]:
        """Create the tenant if needed and a new key for it; returns (tenant_id, key).
        An ``operator`` key sees every tenant in the console (its own tenant's jobs
        through the API, as any key)."""
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        now = datetime.now(UTC)
        with self._sessions.begin() as s:
            tenant = s.scalar(select(Tenant).where(Tenant.name == tenant_name))
            if tenant is None:
                tenant = Tenant(id="ten_" + uuid.uuid4().hex, name=tenant_name, created_at=now)
                s.add(tenant)
                s.flush()
            s.add(ApiKey(id="key_" + uuid.uuid4().hex, tenant_id=tenant.id,
                         prefix=key[:PREFIX_CHARS], key_hash=hash_key(key), created_at=now,
                         operator=operator))
            return tenant.id, key

    def authenticate(self, key: str) -> str | None:
        """Return the tenant id owning an unrevoked key, or None. Records when the key
        was last used, at most once a minute (callers cache the answer briefly)."""
        now = datetime.now(UTC)
        with self._sessions.begin() as s:
            row = s.execute(select(ApiKey.id, ApiKey.tenant_id, ApiKey.last_used_at).where(
                ApiKey.key_hash == hash_key(key), ApiKey.revoked_at.is_(None))).first()
            if row is None:
                return None
            if row.last_used_at is None or row.last_used_at < now - LAST_USED_EVERY:
                s.execute(update(ApiKey).where(ApiKey.id == row.id).values(last_used_at=now))
            return row.tenant_id

    def tenants(self) -> dict[str, str]:
        """Every tenant, id -> name (the console names them for an operator)."""
        with self._sessions() as s:
            return dict(s.execute(select(Tenant.id, Tenant.name).order_by(Tenant.name)).all())

    def list_keys(self, tenant_name: str) -> list[KeyRecord]:
        with self._sessions() as s:
            tenant = s.scalar(select(Tenant).where(Tenant.name == tenant_name))
            if tenant is None:
                raise NotFound(f"no tenant named '{tenant_name}'")
            keys = s.scalars(select(ApiKey).where(ApiKey.tenant_id == tenant.id)
                             .order_by(ApiKey.created_at)).all()
            return [_record(k, tenant.name) for k in keys]

    def revoke(self, prefix: str) -> KeyRecord:
        """Revoke the one key shown with this prefix (revoking twice changes nothing)."""
        with self._sessions.begin() as s:
            rows = s.execute(select(ApiKey, Tenant.name).join(Tenant).where(
                ApiKey.prefix == prefix)).all()
            if not rows:
                raise NotFound(f"no API key with prefix '{prefix}'")
            if len(rows) > 1:
                raise InvalidRequest(f"{len(rows)} keys share the prefix '{prefix}'")
            key, tenant = rows[0]
            if key.revoked_at is None:
                key.revoked_at = datetime.now(UTC)
            return _record(key, tenant)
