"""The schema comes only from Alembic: upgrade, downgrade and upgrade again on both backends."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text

from storage.db import make_engine
from storage.migrate import alembic_config, downgrade, upgrade

from ..services import create_database, drop_database

TABLES = {"tenants", "api_keys", "jobs", "outputs", "outbox", "webhook_endpoints",
          "webhook_secrets", "job_webhooks", "webhook_events", "webhook_deliveries",
          "webhook_attempts", "files", "batches", "batch_rejections", "console_sessions",
          "job_attempts", "workers"}


@pytest.fixture(params=["sqlite", "postgresql"])
def fresh_url(request, tmp_path: Path) -> Iterator[str]:
    """An empty database (never migrated) on each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'fresh.db'}"
        return
    url = create_database()
    try:
        yield url
    finally:
        drop_database(url)


def _head(url: str) -> str:
    head = ScriptDirectory.from_config(alembic_config(url)).get_current_head()
    assert head is not None
    return head


def _state(url: str) -> tuple[set[str], list[str]]:
    """(tables, alembic_version rows) as the database itself reports them."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            tables = set(inspect(conn).get_table_names())
            versions = []
            if "alembic_version" in tables:
                versions = [r[0] for r in conn.execute(
                    text("SELECT version_num FROM alembic_version"))]
        return tables, versions
    finally:
        engine.dispose()


def _assert_at_head(url: str) -> None:
    tables, versions = _state(url)
    assert TABLES <= tables
    assert versions == [_head(url)]


def test_upgrade_downgrade_upgrade(fresh_url: str) -> None:
    tables, _ = _state(fresh_url)
    assert not TABLES & tables

    upgrade(fresh_url)
    _assert_at_head(fresh_url)

    downgrade(fresh_url, "base")
    tables, versions = _state(fresh_url)
    assert not TABLES & tables, f"downgrade left tables behind: {TABLES & tables}"
    assert versions == []

    upgrade(fresh_url)
    _assert_at_head(fresh_url)


def test_upgrade_is_idempotent(fresh_url: str) -> None:
    upgrade(fresh_url)
    upgrade(fresh_url)
    _assert_at_head(fresh_url)


def test_migrated_schema_has_the_model_indexes_and_constraints(fresh_url: str) -> None:
    upgrade(fresh_url)
    engine = make_engine(fresh_url)
    try:
        insp = inspect(engine)
        job_indexes = {ix["name"] for ix in insp.get_indexes("jobs")}
        assert {"ix_jobs_tenant_created", "ix_jobs_status_lease"} <= job_indexes
        outbox_indexes = {ix["name"]: ix["column_names"] for ix in insp.get_indexes("outbox")}
        assert "ix_outbox_unpublished" in outbox_indexes
        assert outbox_indexes.get("ix_outbox_job_id") == ["job_id"]  # sweeps look jobs up
        uniques = {tuple(u["column_names"]) for u in insp.get_unique_constraints("jobs")}
        assert ("tenant_id", "idempotency_key") in uniques
        assert {"ix_jobs_queued_interactive", "ix_jobs_queued_bulk"} <= job_indexes
        worker_cols = {c["name"] for c in insp.get_columns("workers")}
        assert {"host", "pid", "pipelines", "device", "version", "started_at",
                "heartbeat_at", "expires_at", "job_id", "draining_at", "slots",
                "slots_busy", "in_flight"} <= worker_cols  # 0014: slots
        key_cols = {c["name"] for c in insp.get_columns("api_keys")}
        assert {"key_hash", "prefix", "tenant_id", "revoked_at", "operator"} <= key_cols
        # 0006: files record their expiry, found by an index; batches keep their policy
        assert "expired_at" in {c["name"] for c in insp.get_columns("files")}
        file_indexes = {ix["name"]: ix["column_names"] for ix in insp.get_indexes("files")}
        assert file_indexes.get("ix_files_expires_at") == ["expires_at"]
        assert "output_expires_after_s" in {c["name"] for c in insp.get_columns("batches")}
    finally:
        engine.dispose()


def test_models_and_migrations_agree(fresh_url: str) -> None:
    """Autogenerate finds nothing to do: every model change arrived by a migration."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from storage.models import Base

    upgrade(fresh_url)
    engine = make_engine(fresh_url)
    try:
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    finally:
        engine.dispose()
    assert diff == [], diff
