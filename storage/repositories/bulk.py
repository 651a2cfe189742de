"""Multi-row inserts for bulk work: PostgreSQL's COPY, or one executemany elsewhere.

A 50,000-line batch inserts as many jobs and outbox rows. COPY streams them in one
round trip per table; row-by-row ORM inserts would spend seconds in Python instead.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import JSON, Table, insert
from sqlalchemy.orm import Session


def insert_rows(s: Session, table: Table, rows: Sequence[dict[str, Any]]) -> None:
    """Insert ``rows`` (column name -> Python value, the same keys in every row) inside the
    caller's transaction."""
    if not rows:
        return
    if s.get_bind().dialect.name != "postgresql":
        s.execute(insert(table), list(rows))
        return
    columns = list(rows[0])
    as_json = {c for c in columns if isinstance(table.c[c].type, JSON)}
    names = ", ".join(f'"{table.c[c].name}"' for c in columns)
    raw = s.connection().connection.driver_connection
    with raw.cursor() as cur, cur.copy(f'COPY "{table.name}" ({names}) FROM STDIN') as copy:
        for row in rows:
            copy.write_row([_json(row[c]) if c in as_json else row[c] for c in columns])


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"))
