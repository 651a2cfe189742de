"""Pooled connections: pinged at checkout only after sitting idle, and a dead one is
replaced there instead of failing the caller's first statement."""

from __future__ import annotations

from sqlalchemy import text

import storage.db
from storage.db import make_engine


def backend_pid(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT pg_backend_pid()")).scalar_one()


def kill(pg_url: str, pid: int) -> None:
    admin = make_engine(pg_url)
    with admin.connect() as conn:
        conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    admin.dispose()


def test_an_idle_connection_that_died_is_replaced_at_checkout(pg_url, monkeypatch):
    engine = make_engine(pg_url, pool_size=1, max_overflow=0)
    dead = backend_pid(engine)
    kill(pg_url, dead)
    monkeypatch.setattr(storage.db, "PING_IDLE_S", 0.0)  # every checkout counts as idle
    assert backend_pid(engine) != dead  # no error: the ping found it dead
    engine.dispose()


def test_a_connection_just_used_is_not_pinged(pg_url, monkeypatch):
    engine = make_engine(pg_url, pool_size=1, max_overflow=0)
    backend_pid(engine)
    pings = []
    monkeypatch.setattr(engine.dialect, "do_ping", lambda conn: pings.append(conn) or True)
    monkeypatch.setattr(storage.db, "PING_IDLE_S", 60.0)
    backend_pid(engine)
    assert pings == []
    monkeypatch.setattr(storage.db, "PING_IDLE_S", 0.0)
    backend_pid(engine)
    assert len(pings) == 1
    engine.dispose()
