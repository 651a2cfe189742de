"""Webhooks: OpenAI-compatible endpoints (``/v1/webhook_endpoints``), the tenant's
default secret for per-job URLs, and each job's delivery log."""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import APIRouter, Depends, Query

from core.errors import InvalidRequest, NotFound, ServiceUnavailable, clip
from core.jobs import JobKind
from core.ssrf import check_url
from storage.records import DeliveryLogRecord, EndpointRecord, JobWebhookRequest
from storage.repositories.webhook_log import DELIVERY_PREFIX, parse_delivery_id
from storage.repositories.webhooks import EVENT_TYPES, default_events
from storage.views import timestamp

from ..deps import Services, services, tenant_id
from ..guard import GuardedRoute
from ..schemas import (
    EventTypeList,
    ListPage,
    WebhookAttemptPublic,
    WebhookDeliveryList,
    WebhookDeliveryPublic,
    WebhookEndpointCreate,
    WebhookEndpointDeleted,
    WebhookEndpointPublic,
    WebhookEndpointUpdate,
    WebhookEndpointWithSecret,
    WebhookRotateSecret,
    WebhookSecretPublic,
    WebhookTest,
    WebhookTestResult,
    page_of,
)
from ..service import get_job

router = APIRouter(route_class=GuardedRoute)
ENDPOINTS = "/v1/webhook_endpoints"


def check_events(events: list[str], param: str, kind: str | None = None) -> tuple[str, ...]:
    allowed = [e for e in EVENT_TYPES if kind is None or e.startswith(kind + ".")]
    for event in events:
        if event not in allowed:
            raise InvalidRequest(f"unknown event type '{clip(event)}'; one of: "
                                 + ", ".join(allowed), param=param, code="invalid_event_type")
    return tuple(dict.fromkeys(events))


def job_webhook(svc: Services, url: str | None, events: list[str] | None, kind: JobKind
                ) -> JobWebhookRequest | None:
    """A submit's ``webhook_url``/``webhook_events``, checked (blocking: resolves DNS)."""
    if url is None:
        if events:
            raise InvalidRequest("webhook_events needs a webhook_url", param="webhook_events")
        return None
    check_url(url, svc.settings.webhook_networks, param="webhook_url")
    chosen = check_events(events, "webhook_events", kind.value) if events else None
    return JobWebhookRequest(url=url, event_types=chosen or default_events(kind.value))


def _endpoint(record: EndpointRecord, secret: str | None = None
              ) -> WebhookEndpointPublic | WebhookEndpointWithSecret:
    fields = dict(id=record.id, name=record.name, url=record.url,
                  event_types=list(record.event_types), created_at=timestamp(record.created_at),
                  updated_at=timestamp(record.updated_at), signing_secret_hint=record.secret_hint,
                  disabled_at=timestamp(record.disabled_at))
    if secret is None:
        return WebhookEndpointPublic(**fields)
    return WebhookEndpointWithSecret(signing_secret=secret, **fields)


def _found(record, endpoint_id: str):
    if record is None:
        raise NotFound(f"no webhook endpoint with id '{clip(endpoint_id)}'", param="id")
    return record


@router.post(ENDPOINTS, response_model=WebhookEndpointWithSecret)
def create_endpoint(body: WebhookEndpointCreate, svc: Services = Depends(services),
                    tenant: str = Depends(tenant_id)) -> WebhookEndpointWithSecret:
    events = check_events(body.event_types, "event_types")
    check_url(body.url, svc.settings.webhook_networks, param="url")
    record, secret = svc.webhooks.create_endpoint(tenant, name=body.name, url=body.url,
                                                  event_types=list(events))
    return _endpoint(record, secret)


@router.get(ENDPOINTS, response_model=ListPage[WebhookEndpointPublic])
def list_endpoints(after: str | None = Query(default=None, max_length=64),
                   limit: int = Query(default=20, ge=1, le=100),
                   svc: Services = Depends(services), tenant: str = Depends(tenant_id)) -> dict:
    records, has_more = svc.webhooks.list_endpoints(tenant, after=after, limit=limit)
    return page_of([_endpoint(r) for r in records], has_more)


@router.get(ENDPOINTS + "/{endpoint_id}", response_model=WebhookEndpointPublic)
def retrieve_endpoint(endpoint_id: str, svc: Services = Depends(services),
                      tenant: str = Depends(tenant_id)) -> WebhookEndpointPublic:
    return _endpoint(_found(svc.webhooks.get_endpoint(tenant, endpoint_id), endpoint_id))


@router.post(ENDPOINTS + "/{endpoint_id}", response_model=WebhookEndpointPublic)
def update_endpoint(endpoint_id: str, body: WebhookEndpointUpdate,
                    svc: Services = Depends(services),
                    tenant: str = Depends(tenant_id)) -> WebhookEndpointPublic:
    changes = body.model_dump(exclude_none=True)
    if "event_types" in changes:
        changes["event_types"] = list(check_events(body.event_types or [], "event_types"))
    if body.url is not None:
        check_url(body.url, svc.settings.webhook_networks, param="url")
    record = svc.webhooks.update_endpoint(tenant, endpoint_id, **changes)
    return _endpoint(_found(record, endpoint_id))


@router.delete(ENDPOINTS + "/{endpoint_id}", response_model=WebhookEndpointDeleted)
def delete_endpoint(endpoint_id: str, svc: Services = Depends(services),
                    tenant: str = Depends(tenant_id)) -> WebhookEndpointDeleted:
    if not svc.webhooks.delete_endpoint(tenant, endpoint_id):
        _found(None, endpoint_id)
    return WebhookEndpointDeleted(id=endpoint_id)


@router.post(ENDPOINTS + "/{endpoint_id}/rotate_secret",
             response_model=WebhookEndpointWithSecret)
def rotate_secret(endpoint_id: str, body: WebhookRotateSecret | None = None,
                  svc: Services = Depends(services),
                  tenant: str = Depends(tenant_id)) -> WebhookEndpointWithSecret:
    keep = body.keep_old_secret_active_for_24_hours if body else False
    record, secret = _found(svc.webhooks.rotate_endpoint_secret(tenant, endpoint_id, keep),
                            endpoint_id)
    return _endpoint(record, secret)


@router.post(ENDPOINTS + "/{endpoint_id}/test", response_model=WebhookTestResult)
def test_endpoint(endpoint_id: str, body: WebhookTest, svc: Services = Depends(services),
                  tenant: str = Depends(tenant_id)) -> WebhookTestResult:
    """Send a sample event now and report the receiver's status code."""
    record = _found(svc.webhooks.get_endpoint(tenant, endpoint_id), endpoint_id)
    check_events([body.event_type], "event_type")
    if svc.webhook_tester is None:
        raise ServiceUnavailable("webhook tests are not available in this process")
    secret = svc.webhooks.secret_of(record.id, tenant)
    code, error = svc.webhook_tester(record.url, secret.active(datetime.now(UTC)),
                                     body.event_type)
    if code is None:
        raise InvalidRequest(f"the test event could not be delivered: {error}",
                             code="webhook_test_failed")
    return WebhookTestResult(status_code=code, event_type=body.event_type,
                             webhook_endpoint_id=record.id)


@router.get("/v1/webhook_event_types", response_model=EventTypeList)
def event_types(_tenant: str = Depends(tenant_id)) -> EventTypeList:
    return EventTypeList(data=list(EVENT_TYPES))


@router.get("/v1/webhooks/default/secret", response_model=WebhookSecretPublic)
def default_secret(svc: Services = Depends(services),
                   tenant: str = Depends(tenant_id)) -> WebhookSecretPublic:
    """The secret that signs deliveries to per-job ``webhook_url``s (created if none)."""
    record = svc.webhooks.default_secret(tenant)
    kept = len(record.active(datetime.now(UTC))) > 1
    return WebhookSecretPublic(secret=record.secret, created_at=timestamp(record.created_at),
                               previous_secret_expires_at=timestamp(
                                   record.previous_expires_at) if kept else None)


def _delivery(d: DeliveryLogRecord) -> WebhookDeliveryPublic:
    return WebhookDeliveryPublic(
        id=f"{DELIVERY_PREFIX}{d.id}", event_id=d.event_id, event_type=d.event_type,
        webhook_endpoint_id=d.endpoint_id, status=d.status,
        next_attempt_at=timestamp(d.next_attempt_at), created_at=timestamp(d.created_at),
        attempts=[WebhookAttemptPublic(
            attempted_at=timestamp(a.attempted_at), url_host=a.url_host,
            status_code=a.status_code, error=a.error, duration_ms=a.duration_ms,
            next_attempt_at=timestamp(a.next_attempt_at)) for a in d.attempts])


def _log(svc: Services, tenant: str, job_id: str, kind: JobKind | None) -> WebhookDeliveryList:
    job = get_job(svc, tenant, job_id, kind)
    return WebhookDeliveryList(data=[_delivery(d) for d in
                                     svc.webhooks.deliveries_for_job(tenant, job.id)])


@router.get("/v1/jobs/{job_id}/webhook_deliveries", response_model=WebhookDeliveryList)
def job_deliveries(job_id: str, svc: Services = Depends(services),
                   tenant: str = Depends(tenant_id)) -> WebhookDeliveryList:
    return _log(svc, tenant, job_id, None)


@router.get("/v1/videos/{video_id}/webhook_deliveries", response_model=WebhookDeliveryList)
def video_deliveries(video_id: str, svc: Services = Depends(services),
                     tenant: str = Depends(tenant_id)) -> WebhookDeliveryList:
    return _log(svc, tenant, video_id, JobKind.VIDEO)


@router.post("/v1/webhook_deliveries/{delivery_id}/replay", response_model=WebhookDeliveryPublic)
def replay_delivery(delivery_id: str, svc: Services = Depends(services),
                    tenant: str = Depends(tenant_id)) -> WebhookDeliveryPublic:
    """Send a delivery once more, now: a new attempt of the same event (the same
    ``webhook-id``), signed with the secret that is current when it is sent. The answer
    is the delivery as it stands (``pending``); its attempts list grows once sent."""
    return _delivery(replay(svc, tenant, delivery_id))


def replay(svc: Services, tenant: str | None, public_id: str) -> DeliveryLogRecord:
    """The replay itself (the console's button calls it too; ``tenant`` None: an
    operator's, any tenant's delivery)."""
    number = parse_delivery_id(public_id)
    record = svc.webhooks.replay(tenant, number) if number is not None else None
    if record is None:
        raise NotFound(f"no webhook delivery with id '{clip(public_id)}'", param="id")
    return record
