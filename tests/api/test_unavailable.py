"""A database that is down or a connection pool that is exhausted is a 503 with
Retry-After on the auth and read paths, never a 500."""

from __future__ import annotations

import uuid

import pytest

from storage.db import make_engine, make_sessionmaker
from storage.repositories import JobRepository

from ..integration.helpers import assert_openai_error
from .conftest import Api

DEAD_DB = "postgresql://postgres@127.0.0.1:9/nothing"  # discard port: connection refused


def assert_unavailable(resp) -> None:
    assert_openai_error(resp, 503, "service_unavailable")
    assert int(resp.headers["retry-after"]) >= 1


def test_authentication_with_the_database_down_is_503(make_api):
    down = make_api(DEAD_DB)
    with down.client(key="oj-some-key-that-cannot-be-checked") as client:
        assert_unavailable(client.get("/v1/jobs"))
        assert_unavailable(client.post("/v1/audio/speech",
                                       json={"model": "tts-1", "input": "hi"}))


@pytest.fixture
def api_with(make_api):
    """An app whose key lookups work but whose job repository is the one given."""

    def build(jobs_engine) -> Api:
        built = make_api()
        built.services.jobs = JobRepository(make_sessionmaker(jobs_engine))
        return built
    return build


def test_read_routes_with_the_database_down_are_503(api_with):
    engine = make_engine(DEAD_DB)
    built = api_with(engine)
    with built.client("down-" + uuid.uuid4().hex[:8]) as client:
        for path in ("/v1/jobs", "/v1/videos", f"/v1/jobs/job_{'0' * 32}",
                     f"/v1/videos/video_{'0' * 32}/content"):
            assert_unavailable(client.get(path))
    engine.dispose()


def test_exhausted_connection_pool_is_503(api_with, api_db):
    engine = make_engine(api_db)
    engine.dispose()
    from sqlalchemy import create_engine

    tiny = create_engine(engine.url, pool_size=1, max_overflow=0, pool_timeout=0.2)
    built = api_with(tiny)
    held = tiny.connect()  # the only connection, held for the whole request
    try:
        with built.client("pool-" + uuid.uuid4().hex[:8]) as client:
            assert_unavailable(client.get("/v1/jobs"))
    finally:
        held.close()
        tiny.dispose()


def test_api_pool_is_sized_to_its_concurrency(api):
    """Every request thread and the submitter's own threads (a cold key cache sends
    every thread to the database at once) may hold a connection at the same time."""
    from api.submitter import Submitter

    assert api.app.state.engine.pool.size() >= api.settings.api_threads + Submitter.THREADS
