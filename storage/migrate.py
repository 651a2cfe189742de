"""Run Alembic migrations programmatically: the only way the schema changes."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.engine import make_url

from core.errors import ConfigurationError, ServiceUnavailable

from .db import make_engine

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    # Alembic's config is a ConfigParser: a '%' (as in a password) must be doubled.
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


MIGRATE_LOCK = 0x6F6D6E696A6F6273  # "omnijobs": the advisory lock migrations hold


def upgrade(url: str, revision: str = "head") -> tuple[str | None, str | None]:
    """Upgrade; returns the revisions before and after (None: no schema).

    On PostgreSQL one migration runs at a time: each holds a session advisory lock
    while it reads the revision and upgrades, so a second ``omnijobs migrate`` started
    beside the first (two replicas' init steps) waits, then finds the schema at head
    and does nothing, instead of creating ``alembic_version`` a second time
    (UniqueViolation). SQLite, the embedded mode's, has one process migrating it."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATE_LOCK})
                conn.commit()
            before = MigrationContext.configure(conn).get_current_revision()
            conn.commit()
            cfg = alembic_config(url)
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
            conn.commit()
            after = MigrationContext.configure(conn).get_current_revision()
            conn.commit()  # the lock goes with the connection
            return before, after
    finally:
        engine.dispose()


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)


def head_revision() -> str:
    return ScriptDirectory.from_config(alembic_config("")).get_current_head()


def current_revision(url: str) -> str | None:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def where(url: str) -> str:
    """The database as a person would name it: the SQLite file, or the URL without its
    password."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return str(parsed.database)
    return parsed.render_as_string(hide_password=True)


def require_schema(url: str) -> None:
    """Refuse to work on a database that is missing or not migrated, saying where it was
    looked for and what to run, without creating anything (an SQLite file included)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and not Path(parsed.database or "").is_file():
        raise ConfigurationError(
            f"no omnijobs database at {where(url)}: run `omnijobs migrate` first (`make dev` "
            "does), from the folder the service runs in, or set OMNIJOBS_HOME or "
            "OMNIJOBS_DATABASE_URL to the service's database", code="schema_not_ready")
    try:
        found = current_revision(url)
    except ServiceUnavailable as exc:
        raise ServiceUnavailable(f"cannot reach the database at {where(url)}: "
                                 f"{exc.message}") from exc
    head = head_revision()
    if found != head:
        state = "has no omnijobs schema" if found is None else f"is at revision {found}"
        raise ConfigurationError(f"the database at {where(url)} {state}; this version needs "
                                 f"{head}: run `omnijobs migrate`", code="schema_not_ready")
