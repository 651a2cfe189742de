"""Back-pressure: per-tenant active-job caps, per-pipeline queue depth and submit rate
limits answer 429 with Retry-After and store nothing."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from ..conftest import migrated_database
from ..integration.helpers import assert_openai_error
from ..services import redis_base, unavailable
from .conftest import Api

SPEECH = {"model": "tts-1", "input": "Queued."}
ASYNC = {"Prefer": "respond-async"}


def _tenant() -> str:
    return "quota-" + uuid.uuid4().hex[:8]


def _count_jobs(client) -> int:
    return len(client.get("/v1/jobs", params={"limit": 100}).json()["data"])


def assert_too_many(resp, code: str) -> None:
    assert_openai_error(resp, 429, code)
    assert int(resp.headers["retry-after"]) >= 1


@pytest.fixture(scope="module")
def capped(api_db, tmp_path_factory) -> Iterator[Api]:
    built = Api(api_db, tmp_path_factory.mktemp("capped"), tenant_max_active=3)
    yield built
    built.close()


def test_tenant_over_its_active_cap_is_429_and_nothing_is_stored(capped):
    with capped.client(_tenant()) as client, capped.client(_tenant()) as other:
        for _ in range(3):
            assert client.post("/v1/audio/speech", json=SPEECH, headers=ASYNC).status_code == 202
        assert_too_many(client.post("/v1/audio/speech", json=SPEECH, headers=ASYNC),
                        "too_many_active_jobs")
        assert_too_many(client.post("/v1/videos", json={"prompt": "One more."}),
                        "too_many_active_jobs")
        assert _count_jobs(client) == 3
        assert other.post("/v1/audio/speech", json=SPEECH, headers=ASYNC).status_code == 202
        # Finished jobs no longer count.
        first = client.get("/v1/jobs").json()["data"][0]["id"]
        assert client.post(f"/v1/jobs/{first}/cancel").json()["status"] == "cancelled"
        assert client.post("/v1/audio/speech", json=SPEECH, headers=ASYNC).status_code == 202


def test_idempotent_retry_at_the_cap_returns_the_job(capped):
    with capped.client(_tenant()) as client:
        headers = {**ASYNC, "Idempotency-Key": "retry-" + uuid.uuid4().hex}
        job = client.post("/v1/audio/speech", json=SPEECH, headers=headers).json()
        for _ in range(2):
            client.post("/v1/audio/speech", json=SPEECH, headers=ASYNC)
        again = client.post("/v1/audio/speech", json=SPEECH, headers=headers)
        assert again.status_code == 202 and again.json()["id"] == job["id"]


@pytest.fixture
def fresh_db():
    yield from migrated_database()


def test_full_pipeline_queue_is_429_for_everyone(fresh_db, make_api):
    full = make_api(fresh_db, pipeline_max_queued=1)
    with full.client(_tenant()) as client, full.client(_tenant()) as other:
        assert client.post("/v1/videos", json={"prompt": "Last place."}).status_code == 200
        assert_too_many(other.post("/v1/videos", json={"prompt": "No room."}), "queue_full")
        assert _count_jobs(other) == 0
        # Another pipeline's queue is not this one's.
        assert other.post("/v1/audio/speech", json=SPEECH, headers=ASYNC).status_code == 202


def test_embedded_submit_rate_limit_is_in_process(make_api):
    limited = make_api(tenant_submits_per_s=0.5, tenant_submit_burst=2)
    with limited.client(_tenant()) as client, limited.client(_tenant()) as other:
        for _ in range(2):
            assert client.post("/v1/audio/speech", json=SPEECH, headers=ASYNC).status_code == 202
        resp = client.post("/v1/audio/speech", json=SPEECH, headers=ASYNC)
        assert_too_many(resp, "rate_limit_exceeded")
        assert int(resp.headers["retry-after"]) <= 2
        assert _count_jobs(client) == 2
        assert other.post("/v1/audio/speech", json=SPEECH, headers=ASYNC).status_code == 202


def test_rate_limit_is_off_by_default_in_embedded_mode(api):
    assert api.settings.submit_rate[0] == 0
    with api.client(_tenant()) as client:
        for _ in range(5):
            assert client.post("/v1/audio/speech", json=SPEECH, headers=ASYNC).status_code == 202


@pytest.fixture
def redis_broker() -> str:
    url = f"{redis_base()}/0"
    try:
        redis.Redis.from_url(url, socket_connect_timeout=2).ping()
    except redis.RedisError:
        unavailable("Redis")
    return url


def test_rate_limit_is_shared_by_api_processes_through_redis(make_api, redis_broker):
    limits = dict(broker_url=redis_broker, tenant_submits_per_s=0.5, tenant_submit_burst=2)
    one, two = make_api(**limits), make_api(**limits)
    tenant = _tenant()
    key = one.client(tenant).headers["authorization"].removeprefix("Bearer ")
    with one.client(key=key) as a, two.client(key=key) as b:
        assert a.post("/v1/audio/speech", json=SPEECH, headers=ASYNC).status_code == 202
        assert b.post("/v1/audio/speech", json=SPEECH, headers=ASYNC).status_code == 202
        assert_too_many(a.post("/v1/audio/speech", json=SPEECH, headers=ASYNC),
                        "rate_limit_exceeded")
        assert_too_many(b.post("/v1/audio/speech", json=SPEECH, headers=ASYNC),
                        "rate_limit_exceeded")


def test_production_limits_submits_by_default(api_db, tmp_path):
    from core.settings import Settings

    prod = Settings(mode="production", database_url=api_db, broker_url="redis://x",
                    signing_secret="a-real-signing-secret", object_store="local")
    assert prod.submit_rate == (50.0, 100)
