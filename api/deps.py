"""Services shared by the routes, and the dependencies that hand them out."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import Depends, Request
from fastapi.security import HTTPBearer

from core.errors import AuthenticationFailed
from core.settings import Settings
from storage.objects import ObjectStore
from storage.records import OutboxRecord
from storage.repositories import (
    BatchRepository,
    FileRepository,
    JobRepository,
    KeyRepository,
    OutboxRepository,
    WebhookRepository,
)
from storage.repositories.activity import ActivityRepository
from storage.repositories.sessions import SessionRepository
from storage.repositories.usage import UsageRepository

# What the services hold knows nothing of them (the hub, the group commit, the fleet's
# and the queue's views): the modules that take ``Services`` import this one, never the
# other way round, so no import circle (tests/test_house.py), not even one for types.
from .auth import Authenticator
from .fleet import Fleet
from .live_hub import Live
from .ratelimit import RateLimiter
from .standing import Standings
from .submitter import Submitter

Publisher = Callable[[OutboxRecord], None]
PublishMany = Callable[[Sequence[OutboxRecord]], None]  # one broker round trip for all
# (format, sample rate, channels) -> an encoder with content_type, add(samples), close():
# media/stream.py's, handed in by the composition root (the API never imports media).
StreamEncoderFactory = Callable[[str, int, int], Any]
# (url, secrets, event_type) -> (status code, error): sends one sample event now.
WebhookTester = Callable[[str, tuple[str, ...], str], tuple[int | None, str | None]]

# Only documents the scheme in the OpenAPI document: the guard checks the key.
bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer <key>`")


@dataclass
class Services:
    settings: Settings
    jobs: JobRepository
    keys: KeyRepository
    outbox: OutboxRepository
    store: ObjectStore
    publish: Publisher
    ready_checks: dict[str, Callable[[], None]]
    auth: Authenticator
    limiter: RateLimiter
    webhooks: WebhookRepository
    webhook_tester: WebhookTester | None = None
    files: FileRepository | None = None
    batches: BatchRepository | None = None
    publish_many: PublishMany | None = None
    submitter: Submitter | None = None  # group commit of submits (api/submitter.py)
    live: Live | None = None
    stream_encoder: StreamEncoderFactory | None = None
    streamable: frozenset[str] = frozenset()
    console_sessions: SessionRepository | None = None  # the console's (api/console/)
    activity: ActivityRepository | None = None
    usage: UsageRepository | None = None

    fleet: Fleet | None = None  # the worker registry's view (api/fleet.py)
    standings: Standings | None = None  # queued jobs' positions (api/standing.py)


async def services(request: Request) -> Services:
    """Async (as is ``tenant_id``): no I/O, so no hop through the thread pool."""
    return request.app.state.services


async def tenant_id(request: Request, _scheme=Depends(bearer)) -> str:
    """The tenant the guard authenticated (before the body was read)."""
    tenant = getattr(request.state, "tenant_id", None)
    if tenant is None:  # a route declared public that asks for a tenant
        raise AuthenticationFailed("missing bearer API key (Authorization: Bearer <key>)")
    return tenant
