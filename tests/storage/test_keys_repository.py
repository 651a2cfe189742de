"""API keys: shown once, stored only as a hash, authenticate to their tenant."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import select, text, update
from sqlalchemy.orm import Session, sessionmaker

from storage.db import make_engine, make_sessionmaker
from storage.models import ApiKey, Tenant
from storage.repositories import KeyRepository
from storage.repositories.keys import KEY_PREFIX, hash_key


@pytest.fixture
def sessions(db_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(db_url)
    yield make_sessionmaker(engine)
    engine.dispose()


def _name() -> str:
    return "tenant-" + uuid.uuid4().hex


def test_created_key_authenticates_to_its_tenant(sessions) -> None:
    keys = KeyRepository(sessions)
    tenant_id, key = keys.create_key(_name())
    assert key.startswith(KEY_PREFIX)
    assert len(key) > len(KEY_PREFIX) + 32
    assert keys.authenticate(key) == tenant_id
    with sessions() as s:
        assert s.get(Tenant, tenant_id) is not None


def test_wrong_key_is_refused(sessions) -> None:
    keys = KeyRepository(sessions)
    _, key = keys.create_key(_name())
    assert keys.authenticate(key + "x") is None
    assert keys.authenticate(key[:-1]) is None
    assert keys.authenticate(KEY_PREFIX + "not-a-key") is None
    assert keys.authenticate("") is None
    # The stored hash itself is not a credential.
    assert keys.authenticate(hash_key(key)) is None


def test_same_tenant_name_reuses_the_tenant(sessions) -> None:
    keys = KeyRepository(sessions)
    name = _name()
    first_tenant, first_key = keys.create_key(name)
    second_tenant, second_key = keys.create_key(name)
    other_tenant, _ = keys.create_key(_name())

    assert second_tenant == first_tenant
    assert second_key != first_key
    assert other_tenant != first_tenant
    assert keys.authenticate(first_key) == first_tenant
    assert keys.authenticate(second_key) == first_tenant
    with sessions() as s:
        assert len(s.scalars(select(Tenant).where(Tenant.name == name)).all()) == 1
        assert len(s.scalars(select(ApiKey).where(ApiKey.tenant_id == first_tenant)).all()) == 2


def test_database_stores_only_the_hash(sessions) -> None:
    keys = KeyRepository(sessions)
    tenant_id, key = keys.create_key(_name())
    secret_part = key[len(KEY_PREFIX):]
    with sessions() as s:
        rows = s.execute(text("SELECT * FROM api_keys WHERE tenant_id = :t"),
                         {"t": tenant_id}).mappings().all()
    assert len(rows) == 1
    row = rows[0]
    assert row["key_hash"] == hash_key(key)
    for column, value in row.items():
        cell = str(value)
        assert key not in cell, f"plaintext key stored in {column}"
        assert secret_part not in cell, f"key secret stored in {column}"
    # Only a short display prefix is kept in clear.
    assert key.startswith(row["prefix"]) and len(row["prefix"]) <= 16


def test_revoked_key_no_longer_authenticates(sessions) -> None:
    keys = KeyRepository(sessions)
    tenant_id, key = keys.create_key(_name())
    assert keys.authenticate(key) == tenant_id
    with sessions.begin() as s:
        s.execute(update(ApiKey).where(ApiKey.key_hash == hash_key(key))
                  .values(revoked_at=datetime.now(UTC)))
    assert keys.authenticate(key) is None
