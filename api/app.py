"""FastAPI app factory. The composition root (cli.py) hands in the publisher, so the
API never imports the Celery tasks (and never torch or vllm)."""

from __future__ import annotations

import gc
from collections.abc import Callable
from contextlib import asynccontextmanager
from importlib.metadata import version

import anyio.to_thread
from fastapi import FastAPI

from core.settings import Settings
from pipelines import import_pipeline_modules
from storage.bus import make_bus
from storage.db import DbBounds, make_engine, make_sessionmaker, ping
from storage.objects import make_store
from storage.repositories import (
    BatchRepository,
    FileRepository,
    JobRepository,
    KeyRepository,
    OutboxRepository,
    WebhookRepository,
    WorkerRepository,
)
from storage.repositories.activity import ActivityRepository
from storage.repositories.quotas import INTERACTIVE, Quota, Quotas
from storage.repositories.sessions import SessionRepository
from storage.repositories.standing import StandingRepository
from storage.repositories.usage import UsageRepository

from . import console
from .auth import Authenticator
from .deps import Publisher, PublishMany, Services, StreamEncoderFactory, WebhookTester
from .errors import install_error_handlers
from .fleet import Fleet
from .guard import AccessLog
from .live_hub import Live
from .ratelimit import make_rate_limiter
from .routes import (
    batches,
    events,
    files,
    health,
    jobs,
    models,
    objects,
    speech,
    usage,
    video_capabilities,
    videos,
    webhooks,
)
from .schemas import ERROR_RESPONSES
from .standing import Standings
from .submitter import Submitter


def create_app(settings: Settings, publish: Publisher,
               broker_check: Callable[[], None] | None = None,
               webhook_tester: WebhookTester | None = None,
               publish_many: PublishMany | None = None,
               stream_encoder: StreamEncoderFactory | None = None,
               streamable: frozenset[str] = frozenset()) -> FastAPI:
    """``stream_encoder`` and ``streamable`` (media/stream.py's) enable streamed speech."""
    import_pipeline_modules(settings.pipeline_modules)
    # Every worker thread may hold one connection: with as many in the pool, a request
    # never waits for one (and a pool that is still exhausted is a 503, not a hang).
    # The submitter's writer and marker threads hold connections of their own.
    engine = make_engine(settings.db_url, DbBounds.for_api(settings),
                         pool_size=settings.api_threads + Submitter.THREADS, max_overflow=0)
    sessions = make_sessionmaker(engine)
    store = make_store(settings)
    quotas = Quotas({INTERACTIVE: Quota(settings.tenant_max_active,
                                        settings.pipeline_max_queued)})
    keys = KeyRepository(sessions)
    job_repo = JobRepository(sessions, quotas)
    submitter = Submitter()
    bus = make_bus(settings)
    live = Live(bus, bus.watcher(), states=job_repo.states, resync_s=settings.event_resync_s,
                max_streams=settings.tenant_max_streams)

    checks = {"database": lambda: ping(engine), "storage": store.check}
    if broker_check is not None:
        checks["broker"] = broker_check

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.api_threads
        yield
        submitter.flush()

    # /docs is the console's (api/console/assets.py): Swagger UI from the package, offline.
    # FastAPI's own OpenTelemetry hooks are off: nothing here exports spans, and asking
    # for a provider on every request cost about 5 % of a submit's CPU.
    app = FastAPI(title="omnijobs", version=version("omnijobs"), lifespan=lifespan,
                  docs_url=None, redoc_url=None,
                  telemetry={"tracing": False, "metrics": False, "logs": False})
    app.state.engine = engine
    fleet = Fleet(WorkerRepository(sessions))
    app.state.services = Services(
        settings=settings, jobs=job_repo, keys=keys,
        outbox=OutboxRepository(sessions), store=store, publish=publish, ready_checks=checks,
        auth=Authenticator(keys, settings.auth_cache_ttl_s),
        limiter=make_rate_limiter(settings),
        webhooks=WebhookRepository(sessions), webhook_tester=webhook_tester,
        files=FileRepository(sessions), batches=BatchRepository(sessions),
        publish_many=publish_many, submitter=submitter,
        live=live, stream_encoder=stream_encoder,
        streamable=streamable if stream_encoder is not None else frozenset(),
        console_sessions=SessionRepository(sessions), activity=ActivityRepository(sessions),
        usage=UsageRepository(sessions),
        fleet=fleet, standings=Standings(StandingRepository(sessions), fleet))
    install_error_handlers(app)
    for module in (speech, video_capabilities, videos, jobs, events, models, objects, files,
                   batches, webhooks, usage):
        app.include_router(module.router, responses=ERROR_RESPONSES)
    app.include_router(health.router)
    console.install(app)
    if settings.metrics_public:
        app.include_router(health.metrics_router)
    app.add_middleware(AccessLog)
    app.openapi = _openapi_without_422(app)
    return app


GC_YOUNG_THRESHOLD = 20_000  # allocations between young collections (CPython: 700)


def quiet_collector() -> None:
    """For a serving process (``omnijobs api``), once the app is built: everything
    allocated so far (modules, the app, the ORM's mappings, pydantic's validators:
    hundreds of thousands of objects that live as long as the process) leaves the cyclic
    collector's view (``gc.freeze``), and the youngest generation is collected less
    often. A request's garbage is mostly freed by reference counting; without this, the
    collector's passes over the startup heap were a visible part of a submit's CPU and
    of its p99."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


def _openapi_without_422(app: FastAPI) -> Callable[[], dict]:
    """Invalid requests are 400s in OpenAI's shape here, never FastAPI's 422."""
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = build()
            for path in schema.get("paths", {}).values():
                for operation in path.values():
                    operation.get("responses", {}).pop("422", None)
            for name in ("HTTPValidationError", "ValidationError"):
                schema.get("components", {}).get("schemas", {}).pop(name, None)
        return app.openapi_schema
    return openapi
