"""The declarative base and the column types every table group shares."""

from __future__ import annotations

from datetime import UTC

from sqlalchemy import (
    DateTime,
)
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.types import TypeDecorator


class UTCDateTime(TypeDecorator):
    """Timestamps are always UTC-aware in Python, whatever the backend returns.

    SQLite has no time zone type: it gets naive UTC strings (which still sort and
    compare correctly), PostgreSQL gets ``timestamptz``.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value, dialect):
        if value is None:
            return None
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value, dialect):
        if value is None or value.tzinfo is not None:
            return value
        return value.replace(tzinfo=UTC)


class Base(DeclarativeBase):
    pass
