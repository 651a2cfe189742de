"""FastAPI app factory. The composition root (cli.py) hands in the publisher, so the
API never imports the Celery tasks (and never torch or vllm)."""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import version

from fastapi import FastAPI

from core.settings import Settings
from pipelines import import_pipeline_modules
from storage.db import make_engine, make_sessionmaker, ping
from storage.objects import make_store
from storage.repositories import (
    BatchRepository,
    FileRepository,
    JobRepository,
    KeyRepository,
    OutboxRepository,
    WebhookRepository,
)

from .deps import Publisher, Services, WebhookTester
from .errors import install_error_handlers
from .routes import batches, files, health, jobs, models, objects, speech, videos, webhooks


def create_app(settings: Settings, publish: Publisher,
               broker_check: Callable[[], None] | None = None,
               webhook_tester: WebhookTester | None = None) -> FastAPI:
    import_pipeline_modules(settings.pipeline_modules)
    engine = make_engine(settings.db_url)
    sessions = make_sessionmaker(engine)
    store = make_store(settings)

    checks = {"database": lambda: ping(engine), "storage": store.check}
    if broker_check is not None:
        checks["broker"] = broker_check
    app = FastAPI(title="omnijobs", version=version("omnijobs"))
    app.state.services = Services(
        settings=settings, jobs=JobRepository(sessions), keys=KeyRepository(sessions),
        outbox=OutboxRepository(sessions), store=store, publish=publish, ready_checks=checks,
        webhooks=WebhookRepository(sessions), webhook_tester=webhook_tester,
        files=FileRepository(sessions), batches=BatchRepository(sessions))
    install_error_handlers(app)
    for module in (speech, videos, jobs, models, objects, files, batches, health, webhooks):
        app.include_router(module.router)
    return app
