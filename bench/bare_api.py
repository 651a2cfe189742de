"""The bare baseline for the submit path: the cost of durability with these parts alone.

``POST /v1/audio/speech`` validates the body with the service's own pydantic model
(``api.schemas.SpeechCreate``), inserts a job row and an outbox row in one transaction
with asyncpg into the migrated schema, LPUSHes the id to Redis and answers 202. No auth,
no model resolution, no Celery, no access log: what is left is the floor a submit
cannot go below with PostgreSQL, Redis, FastAPI and uvicorn in one process.

    python -m bench.bare_api --port 8100 --database-url postgresql://... --redis-url redis://...
"""

from __future__ import annotations

import argparse
import json
import uuid
from contextlib import asynccontextmanager
from datetime import UTC, datetime

import asyncpg
import redis.asyncio as aioredis
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from api.schemas import SpeechCreate

POOL_SIZE = 10  # the omnijobs API's pool: 5 + 5 overflow
QUEUE_KEY = "bench:bare"
PIPELINE, QUEUE = "piper-joe", "pipeline.piper-joe"

INSERT_JOB = """
INSERT INTO jobs (id, tenant_id, kind, model, pipeline, status, progress, request, metadata,
                  attempts, max_attempts, created_at, updated_at)
VALUES ($1, $2, 'speech', $3, $4, 'queued', 0, $5, $6, 0, 3, $7, $7)"""
INSERT_OUTBOX = """
INSERT INTO outbox (topic, job_id, queue, payload, created_at, available_at)
VALUES ('render', $1, $2, $3, $4, $4)"""
INSERT_TENANT = "INSERT INTO tenants (id, name, created_at) VALUES ($1, $2, $3)"


async def ensure_tenant(pool: asyncpg.Pool) -> str:
    tenant = "ten_bare" + uuid.uuid4().hex[:24]
    await pool.execute(INSERT_TENANT, tenant, tenant, datetime.now(UTC))
    return tenant


def create_app(database_url: str, redis_url: str) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.pool = await asyncpg.create_pool(database_url, min_size=POOL_SIZE,
                                                   max_size=POOL_SIZE)
        app.state.redis = aioredis.from_url(redis_url)
        app.state.tenant = await ensure_tenant(app.state.pool)
        yield
        await app.state.redis.aclose()
        await app.state.pool.close()

    app = FastAPI(lifespan=lifespan)

    @app.get("/healthz")
    async def healthz() -> dict:
        return {"status": "ok"}

    @app.post("/v1/audio/speech", status_code=202)
    async def speech(body: SpeechCreate, request: Request) -> JSONResponse:
        state = request.app.state
        job_id = "job_" + uuid.uuid4().hex
        fields = body.model_dump(exclude_none=True,
                                 exclude={"model", "metadata", "stream_format"})
        now = datetime.now(UTC)
        async with state.pool.acquire() as conn, conn.transaction():
            await conn.execute(INSERT_JOB, job_id, state.tenant, body.model, PIPELINE,
                               json.dumps(fields), json.dumps(body.metadata), now)
            await conn.execute(INSERT_OUTBOX, job_id, QUEUE, json.dumps({"job_id": job_id}),
                               now)
        await state.redis.lpush(QUEUE_KEY, job_id)
        return JSONResponse({"id": job_id, "object": "job", "status": "queued"},
                            status_code=202)

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--redis-url", required=True)
    args = parser.parse_args()
    uvicorn.run(create_app(args.database_url, args.redis_url), host=args.host,
                port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
