"""The console's actions (POST), each refused without the session's CSRF token and each
done by the same function the JSON route runs (cancel, delete, replay, batch cancel,
rotate, test): the console is a view of the API, never a second way to change state.

An operator acts on another tenant's resource as that tenant (the resource is first
found with the operator's every-tenant scope); a tenant only ever finds its own."""

from __future__ import annotations

from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import RedirectResponse, Response

from core.errors import InvalidRequest, NotFound, clip

from ..deps import Services, services
from ..guard import body_limit
from ..routes import batches as batch_routes
from ..routes import jobs as job_routes
from ..routes import webhooks as webhook_routes
from ..schemas import WebhookRotateSecret, WebhookTest
from ..service import get_job
from .pages import signed_in
from .render import ConsoleRoute, page
from .session import PATH, Viewer, check_csrf, viewer

router = APIRouter(prefix=PATH, route_class=ConsoleRoute, include_in_schema=False)
FORM_LIMIT = body_limit(lambda _settings: 16 * 1024)  # a form of a few fields
Csrf = Form(default=None, max_length=128)


async def actor(request: Request, csrf: str | None = Csrf,
                who: Viewer = Depends(viewer)) -> Viewer:
    """Who runs an action: the signed-in viewer, once the action's CSRF token (form field
    or header) is the session's. Every POST of the console takes this."""
    check_csrf(who.csrf, request, csrf)
    return who


def back(path: str, **notice: str) -> RedirectResponse:
    return RedirectResponse(f"{PATH}{path}" + (f"?{urlencode(notice)}" if notice else ""),
                            status_code=303)


@router.post("/jobs/{job_id}/cancel")
@FORM_LIMIT
@signed_in
def cancel_job(job_id: str, svc: Services = Depends(services),
               who: Viewer = Depends(actor)) -> Response:
    job = get_job(svc, who.scope, job_id)
    job_routes.cancel_job(job.id, svc=svc, tenant=who.acts_as(job.tenant_id))
    return back(f"/jobs/{job.id}", notice="cancelled")


@router.post("/jobs/{job_id}/delete")
@FORM_LIMIT
@signed_in
def delete_job(job_id: str, svc: Services = Depends(services),
               who: Viewer = Depends(actor)) -> Response:
    job = get_job(svc, who.scope, job_id)
    job_routes.delete_job(job.id, svc=svc, tenant=who.acts_as(job.tenant_id))
    return back("/jobs", notice="deleted")


@router.post("/deliveries/{delivery_id}/replay")
@FORM_LIMIT
@signed_in
def replay_delivery(delivery_id: str, svc: Services = Depends(services),
                    who: Viewer = Depends(actor)) -> Response:
    record = webhook_routes.replay(svc, who.scope, delivery_id)
    return back(f"/jobs/{record.job_id}", notice="replayed")


@router.post("/batches/{batch_id}/cancel")
@FORM_LIMIT
@signed_in
def cancel_batch(batch_id: str, svc: Services = Depends(services),
                 who: Viewer = Depends(actor)) -> Response:
    batch = batch_routes.get_batch(svc, who.scope, batch_id)
    batch_routes.cancel_batch(batch.id, svc=svc, tenant=who.acts_as(batch.tenant_id))
    return back("/batches", notice="batch_cancelled")


def _endpoint(svc: Services, who: Viewer, endpoint_id: str):
    record = svc.webhooks.get_endpoint(who.scope, endpoint_id)
    if record is None:
        raise NotFound(f"no webhook endpoint with id '{clip(endpoint_id)}'", param="id")
    return record


@router.post("/webhooks/{endpoint_id}/rotate")
@FORM_LIMIT
@signed_in
def rotate_secret(endpoint_id: str, keep: bool = Form(default=False),
                  svc: Services = Depends(services),
                  who: Viewer = Depends(actor)) -> Response:
    """The new secret is shown once, on the answer to this POST (never in a URL)."""
    record = _endpoint(svc, who, endpoint_id)
    rotated = webhook_routes.rotate_secret(
        record.id, WebhookRotateSecret(keep_old_secret_active_for_24_hours=keep), svc=svc,
        tenant=who.acts_as(record.tenant_id))
    return page("secret.html", viewer=who, nav="webhooks", endpoint=rotated, kept=keep)


@router.post("/webhooks/{endpoint_id}/test")
@FORM_LIMIT
@signed_in
def test_endpoint(endpoint_id: str, event_type: str = Form(max_length=64),
                  svc: Services = Depends(services),
                  who: Viewer = Depends(actor)) -> Response:
    record = _endpoint(svc, who, endpoint_id)
    try:
        result = webhook_routes.test_endpoint(record.id, WebhookTest(event_type=event_type),
                                              svc=svc, tenant=who.acts_as(record.tenant_id))
    except InvalidRequest as exc:
        if exc.code != "webhook_test_failed":
            raise
        return back("/webhooks", notice="test_failed", endpoint=record.id)
    return back("/webhooks", notice="test_sent", endpoint=record.id,
                status=str(result.status_code))
