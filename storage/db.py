"""Engine and session factory, the one place a database connection is configured.

PostgreSQL connections are bounded (``DbBounds``): connect timeout, statement timeout,
a client-side wait for every answer, kernel keepalives, a pool timeout, so a stalled
database is a 503 (or a retried step) within a stated time, never a thread held for ever.
SQLite gets WAL and a busy timeout so the embedded mode's API and worker processes can
share one file."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

from sqlalchemy import Engine, create_engine, event, make_url, text
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.exc import DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session, sessionmaker

from core.errors import ServiceUnavailable
from core.settings import Settings

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


def rolled_back(exc: BaseException) -> bool:
    """The database aborted the transaction to break a deadlock or a serialization
    conflict (SQLSTATE class 40): nothing of it was written, so running it again is safe."""
    return str(getattr(exc.__cause__, "sqlstate", None) or "").startswith("40")


@dataclass(frozen=True)
class DbBounds:
    """How long a database call may take. A database that is down fails fast; one that
    stalls (a frozen server, a partition, a proxy that stops forwarding) sends no error,
    and without these bounds a thread would wait on it for ever.

    ``connect_s``: connecting (TCP and authentication). ``statement_s``: the longest a
    statement may run (PostgreSQL's ``statement_timeout``); the client waits for an
    answer ``ANSWER_MARGIN_S`` longer, then closes the connection (a 503). None: no
    bound on statements (migrations, the admin commands). ``pool_timeout_s``: waiting for
    a free pooled connection."""

    connect_s: int = 5
    statement_s: float | None = None
    pool_timeout_s: float = 30.0

    @classmethod
    def for_api(cls, settings: Settings) -> DbBounds:
        return cls(settings.db_connect_timeout_s, settings.db_statement_timeout_s,
                   settings.db_pool_timeout_s)

    @classmethod
    def for_tasks(cls, settings: Settings) -> DbBounds:
        return cls(settings.db_connect_timeout_s, settings.db_task_statement_timeout_s)


ANSWER_MARGIN_S = 1.0  # past statement_timeout: the server had its chance to cancel
# Kernel keepalives on idle pooled connections: a peer gone without a reset (a host
# that vanished) is found within about 30 + 3 * 10 s.
KEEPALIVES = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10,
              "keepalives_count": 3}


def make_engine(url: str, bounds: DbBounds = DbBounds(), *, pool_size: int = 5,
                max_overflow: int = 5) -> Engine:
    """The API sizes its pool to its thread count (every thread may hold one
    connection), so a request never queues for one; workers keep the small default."""
    engine = _create(url, bounds, pool_size, max_overflow)
    event.listen(engine, "handle_error", _unavailable)
    return engine


def _create(url: str, bounds: DbBounds, pool_size: int, max_overflow: int) -> Engine:
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
                           pool_timeout=bounds.pool_timeout_s,
                           connect_args=_connect_args(url, bounds))
    if bounds.statement_s is not None:
        _answer_within(engine, bounds.statement_s + ANSWER_MARGIN_S)
    _ping_when_idle(engine)
    return engine


def _connect_args(url: str, bounds: DbBounds) -> dict:
    args: dict = {"connect_timeout": bounds.connect_s, **KEEPALIVES}
    if bounds.statement_s is not None:
        options = make_url(url).query.get("options", "")
        timeout = f"-c statement_timeout={max(1, round(bounds.statement_s * 1000))}"
        args["options"] = f"{options} {timeout}".strip()
    return args


_ANSWER_S: ContextVar[float | None] = ContextVar("answer_s", default=None)


@contextlib.contextmanager
def answer_within(seconds: float) -> Iterator[None]:
    """Database calls made in this block (on this thread) wait at most ``seconds`` for an
    answer, if that is less than their engine's bound: a lease heartbeat must not wait
    longer than its lease."""
    token = _ANSWER_S.set(seconds)
    try:
        yield
    finally:
        _ANSWER_S.reset(token)


def _answer_within(engine: Engine, answer_s: float) -> None:
    """Connections that stop waiting for an answer after ``answer_s`` and close
    themselves (psycopg has no client-side statement timeout of its own)."""
    import psycopg

    class Bounded(psycopg.Connection):
        def wait(self, gen, interval: float = 0.1, timeout: float | None = None):
            limit = min(t for t in (timeout, _ANSWER_S.get(), answer_s) if t is not None)
            try:
                return super().wait(gen, interval, limit)
            except psycopg.errors._WaitTimeout:  # psycopg's own, internal, timeout
                self.pgconn.finish()  # mid-protocol: unusable; SQLAlchemy drops it
                raise psycopg.OperationalError(
                    f"no answer from the database in {limit:g}s") from None

    @event.listens_for(engine, "do_connect")
    def _connect(_dialect, _record, cargs, cparams):
        return Bounded.connect(*cargs, **cparams)


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
