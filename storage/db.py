"""Engine and session factory. SQLite gets WAL and a busy timeout so the embedded
mode's API and worker processes can share one file."""

from __future__ import annotations

import time

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.exc import DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session, sessionmaker

from core.errors import ServiceUnavailable

# The database is down, unreachable or saturated (no connection free in time): a caller
# may retry later. Anything else the database raises is a bug, not an outage. Driver
# errors are translated by ``_unavailable``; a pool time-out never reaches the driver.
UNAVAILABLE_ERRORS = (OperationalError, InterfaceError, PoolTimeout)


def _unavailable(ctx: ExceptionContext) -> None:
    """A dropped or refused connection is a dependency that is down (503, retryable), not a
    bug; translated here, where the driver's errors enter. Pre-ping failures are left to
    the pool, which reconnects."""
    if ctx.is_pre_ping:
        return
    if ctx.is_disconnect or isinstance(ctx.sqlalchemy_exception,
                                       (OperationalError, InterfaceError)):
        raise ServiceUnavailable(
            f"database unavailable ({type(ctx.original_exception).__name__})"
        ) from ctx.original_exception


def make_engine(url: str, *, pool_size: int = 5, max_overflow: int = 5,
                pool_timeout: float = 30.0) -> Engine:
    """The API sizes its pool to its thread count (every thread may hold one
    connection), so a request never queues for one; workers keep the small default."""
    engine = _create(url, pool_size, max_overflow, pool_timeout)
    event.listen(engine, "handle_error", _unavailable)
    return engine


def _create(url: str, pool_size: int, max_overflow: int, pool_timeout: float) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record):  # pragma: no cover - trivial
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    engine = create_engine(url, pool_size=pool_size, max_overflow=max_overflow,
                           pool_timeout=pool_timeout)
    _ping_when_idle(engine)
    return engine


# A pooled connection used this recently is taken as alive; one idle for longer is
# pinged at checkout (and replaced if dead). A database that dies within this window
# fails the statement itself: a 503 (or a retried task), as a failure mid-request is.
PING_IDLE_S = 1.0


def _ping_when_idle(engine: Engine) -> None:
    """SQLAlchemy's ``pool_pre_ping`` costs a round trip on every checkout, i.e. one more
    per transaction on the hot paths (a submit group, a claim, a heartbeat); this pings
    only connections that sat idle."""

    @event.listens_for(engine, "connect")
    def _fresh(_dbapi_conn, record) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkin")
    def _returned(_dbapi_conn, record) -> None:
        if record is not None:
            record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _taken(dbapi_conn, record, _proxy) -> None:
        if time.monotonic() - record.info.get("idle_since", 0.0) < PING_IDLE_S:
            return
        try:
            alive = engine.dialect.do_ping(dbapi_conn)
        except Exception as exc:
            raise DisconnectionError("pooled connection is dead") from exc
        if alive is False:
            raise DisconnectionError("pooled connection is dead")


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def ping(engine: Engine) -> None:
    """Readiness: one round trip to the database."""
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))
