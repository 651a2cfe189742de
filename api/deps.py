"""Services shared by the routes, and the dependencies that hand them out."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fastapi import Depends, Request

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

Publisher = Callable[[OutboxRecord], None]
# (url, secrets, event_type) -> (status code, error): sends one sample event now.
WebhookTester = Callable[[str, tuple[str, ...], str], tuple[int | None, str | None]]


@dataclass
class Services:
    settings: Settings
    jobs: JobRepository
    keys: KeyRepository
    outbox: OutboxRepository
    store: ObjectStore
    publish: Publisher
    ready_checks: dict[str, Callable[[], None]]
    webhooks: WebhookRepository
    webhook_tester: WebhookTester | None = None
    files: FileRepository | None = None
    batches: BatchRepository | None = None


def services(request: Request) -> Services:
    return request.app.state.services


def tenant_id(request: Request, svc: Services = Depends(services)) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise AuthenticationFailed("missing bearer API key (Authorization: Bearer <key>)")
    tenant = svc.keys.authenticate(key.strip())
    if tenant is None:
        raise AuthenticationFailed("invalid API key")
    return tenant
