"""The API in-process over a real PostgreSQL database of its own (nothing publishes:
jobs stay queued), for tests that need to reach into its repositories."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from core.settings import Settings

from ..conftest import migrated_database
from ..services import new_key


@pytest.fixture(scope="session")
def api_db() -> Iterator[str]:
    yield from migrated_database()


def api_settings(db_url: str, home: Path, **overrides) -> Settings:
    values = dict(mode="embedded", home=home, database_url=db_url,
                  signing_secret="api-tests-signing-secret",
                  pipelines=["piper-joe", "reference-t2va"], sync_wait_default_s=0,
                  event_stream_max_s=0.5)  # nothing renders here: event streams end soon
    values.update(overrides)
    return Settings(**values)


class Api:
    """An in-process app, its services and a way to make authenticated clients."""

    def __init__(self, db_url: str, home: Path, **overrides) -> None:
        self.db_url = db_url
        self.settings = api_settings(db_url, home, **overrides)
        # Webhook endpoint tests "reach" a receiver that answers 204 (no network here).
        self.app = create_app(self.settings, publish=lambda _msg: None,
                              webhook_tester=lambda _url, _secrets, _type: (204, None))
        self.services = self.app.state.services

    def close(self) -> None:
        """Close the app's connections (each app holds its own pool)."""
        self.app.state.engine.dispose()

    def client(self, tenant: str | None = None, key: str | None = None) -> TestClient:
        if tenant is not None:
            key = new_key(self.db_url, tenant)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return TestClient(self.app, headers=headers, raise_server_exceptions=False)


@pytest.fixture(scope="module")
def api(api_db, tmp_path_factory) -> Iterator[Api]:
    built = Api(api_db, tmp_path_factory.mktemp("api-home"))
    yield built
    built.close()


@pytest.fixture
def make_api(api_db, tmp_path) -> Iterator[Callable[..., Api]]:
    """Apps with other settings (or another database), closed after the test."""
    built: list[Api] = []

    def make(db_url: str | None = None, **overrides) -> Api:
        built.append(Api(db_url or api_db, tmp_path / f"app{len(built)}", **overrides))
        return built[-1]
    yield make
    for app in built:
        app.close()
