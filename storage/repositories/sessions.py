"""Console sessions: a browser that signed in with an API key holds a random token in a
cookie; the database holds only its SHA-256, the key it was opened with and the CSRF
token of its forms. A session ends when it is idle too long, when it signs out, or when
its key is revoked (the lookup joins the key every time)."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session, sessionmaker

from ..models import ApiKey, ConsoleSession, Tenant
from ..records import SessionRecord
from .keys import hash_key

TOUCH_EVERY = timedelta(seconds=30)  # last_seen_at is written at most this often (or a
# quarter of the idle time, if that is shorter, so an active session never lapses)


def _now() -> datetime:
    return datetime.now(UTC)


def _record(row, csrf: str) -> SessionRecord:
    return SessionRecord(tenant_id=row.tenant_id, tenant_name=row.name,
                         operator=bool(row.operator), key_prefix=row.prefix, csrf=csrf)


def _key_row(s: Session, *where):
    return s.execute(select(ApiKey.id, ApiKey.tenant_id, ApiKey.operator, ApiKey.prefix,
                            Tenant.name).join(Tenant, Tenant.id == ApiKey.tenant_id)
                     .where(ApiKey.revoked_at.is_(None), *where)).first()


class SessionRepository:
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    def open(self, key: str, idle_s: float) -> tuple[str, SessionRecord] | None:
        """A new session for an unrevoked key: (cookie token, session), or None for a
        wrong key. Sessions idle past ``idle_s`` are deleted on the way."""
        now = _now()
        token = secrets.token_urlsafe(32)
        with self._sessions.begin() as s:
            row = _key_row(s, ApiKey.key_hash == hash_key(key))
            if row is None:
                return None
            s.execute(delete(ConsoleSession).where(
                ConsoleSession.last_seen_at < now - timedelta(seconds=idle_s)))
            csrf = secrets.token_urlsafe(32)
            s.add(ConsoleSession(id=hash_key(token), key_id=row.id, csrf=csrf, created_at=now,
                                 last_seen_at=now))
            return token, _record(row, csrf)

    def check(self, token: str, idle_s: float) -> SessionRecord | None:
        """The session of this cookie token, if it is open, recent and its key valid."""
        now = _now()
        with self._sessions.begin() as s:
            found = s.execute(select(ConsoleSession.id, ConsoleSession.key_id,
                                     ConsoleSession.csrf, ConsoleSession.last_seen_at).where(
                ConsoleSession.id == hash_key(token))).first()
            if found is None or found.last_seen_at < now - timedelta(seconds=idle_s):
                return None
            row = _key_row(s, ApiKey.id == found.key_id)
            if row is None:
                return None
            if found.last_seen_at < now - min(TOUCH_EVERY, timedelta(seconds=idle_s / 4)):
                s.execute(update(ConsoleSession).where(ConsoleSession.id == found.id)
                          .values(last_seen_at=now))
            return _record(row, found.csrf)

    def close(self, token: str) -> None:
        with self._sessions.begin() as s:
            s.execute(delete(ConsoleSession).where(ConsoleSession.id == hash_key(token)))
