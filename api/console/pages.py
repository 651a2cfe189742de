"""The console's pages (GET): each reads through the repositories the API's routes use,
scoped to the viewer (its tenant, or every tenant for an operator's key)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from fastapi import APIRouter, Depends, Query
from fastapi.responses import RedirectResponse, Response

from core.errors import InvalidRequest
from core.jobs import JobKind, JobStatus, is_job_id
from storage.batch_views import batch_view
from storage.records import JobFilter
from storage.repositories.webhook_log import recent_window
from storage.repositories.webhooks import EVENT_TYPES

from ..deps import Services, services
from ..guard import authenticated_by
from ..service import get_job
from . import figures
from .render import ConsoleRoute, page
from .session import PATH, Viewer, authenticate, viewer

router = APIRouter(prefix=PATH, route_class=ConsoleRoute, include_in_schema=False)
signed_in = authenticated_by(authenticate)


DAY = r"^(\d{4}-\d{2}-\d{2})?$"  # a date input's value, or nothing


@dataclass
class JobsQuery:
    """The Jobs page's filters, as query parameters (bookmarkable; no key in them). An
    empty field (the form's "any") is no filter."""

    status: JobStatus | Literal[""] | None = Query(default=None)
    kind: JobKind | Literal[""] | None = Query(default=None)
    model: str | None = Query(default=None, max_length=200)
    tenant: str | None = Query(default=None, max_length=40)
    batch: str | None = Query(default=None, max_length=64)
    since: str | None = Query(default=None, max_length=10, pattern=DAY)
    until: str | None = Query(default=None, max_length=10, pattern=DAY)
    q: str | None = Query(default=None, max_length=64)
    after: str | None = Query(default=None, max_length=64)
    limit: int = Query(default=25, ge=1, le=100)

    def job_filter(self, viewer: Viewer) -> JobFilter:
        """A tenant's filter is always its own tenant, whatever ``tenant`` says."""
        tenant = (self.tenant or None) if viewer.operator else viewer.session.tenant_id
        return JobFilter(tenant_id=tenant, status=self.status or None, kind=self.kind or None,
                         model=self.model or None, batch_id=self.batch or None,
                         created_after=_day(self.since),
                         created_before=_day(self.until, plus=timedelta(days=1)))

    def params(self) -> dict[str, str]:
        """The filters again (links to the next page and the live stream keep them)."""
        values = {k: getattr(self, k) for k in ("status", "kind", "model", "tenant", "batch",
                                                 "since", "until")}
        return {k: str(v) for k, v in values.items() if v}


def _day(value: str | None, plus: timedelta = timedelta()) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.strptime(value, "%Y-%m-%d").replace(tzinfo=UTC) + plus
    except ValueError:
        raise InvalidRequest(f"'{value}' is not a date (YYYY-MM-DD)", param="since") from None


def tenant_names(svc: Services, who: Viewer) -> dict[str, str]:
    if not who.operator:
        return {who.session.tenant_id: who.session.tenant_name}
    return svc.keys.tenants()


@router.get("")
@signed_in
def overview(svc: Services = Depends(services), who: Viewer = Depends(viewer)) -> Response:
    return page("overview.html", viewer=who, nav="overview",
                figures=figures.overview(svc, who.scope))


def jobs_page(svc: Services, who: Viewer, query: JobsQuery):
    jobs, has_more = svc.jobs.find(query.job_filter(who), after=query.after or None,
                                   limit=query.limit)
    return jobs, has_more


@router.get("/jobs")
@signed_in
def jobs(query: JobsQuery = Depends(), svc: Services = Depends(services),
         who: Viewer = Depends(viewer)) -> Response:
    if query.q:
        target = query.q.strip()
        if is_job_id(target):
            return RedirectResponse(f"{PATH}/jobs/{target}", status_code=303)
        query.batch = target if target.startswith("batch_") else query.batch
    rows, has_more = jobs_page(svc, who, query)
    return page("jobs.html", viewer=who, nav="jobs", jobs=rows, has_more=has_more,
                query=query, params=query.params(), tenants=tenant_names(svc, who),
                statuses=list(JobStatus), kinds=list(JobKind))


@router.get("/jobs/{job_id}")
@signed_in
def job(job_id: str, svc: Services = Depends(services),
        who: Viewer = Depends(viewer)) -> Response:
    record = get_job(svc, who.scope, job_id)
    return page("job.html", viewer=who, nav="jobs", job=record, **job_parts(svc, record),
                request_json=json.dumps(record.request, indent=2, ensure_ascii=False),
                tenants=tenant_names(svc, who))


def job_parts(svc: Services, record) -> dict:
    """What the job page's live parts show (the stream renders the same)."""
    return {"attempts": svc.jobs.attempts(record.id),
            "deliveries": svc.webhooks.deliveries_for_job(record.tenant_id, record.id)}


@router.get("/batches")
@signed_in
def batches(after: str | None = Query(default=None, max_length=64),
            svc: Services = Depends(services), who: Viewer = Depends(viewer)) -> Response:
    records, has_more = svc.batches.list(who.scope, after=after, limit=25)
    return page("batches.html", viewer=who, nav="batches", has_more=has_more,
                batches=[(r, batch_view(r)) for r in records], tenants=tenant_names(svc, who))


@router.get("/webhooks")
@signed_in
def webhooks(svc: Services = Depends(services), who: Viewer = Depends(viewer)) -> Response:
    endpoints, _ = svc.webhooks.list_endpoints(who.scope, limit=100)
    rates = svc.webhooks.failure_rates([e.id for e in endpoints], recent_window())
    recent = {e.id: svc.webhooks.recent_deliveries(who.scope, e.id, 10) for e in endpoints}
    return page("webhooks.html", viewer=who, nav="webhooks", endpoints=endpoints, rates=rates,
                recent=recent, event_types=EVENT_TYPES, tenants=tenant_names(svc, who))


@router.get("/workers")
@signed_in
def workers(svc: Services = Depends(services), who: Viewer = Depends(viewer)) -> Response:
    live = figures.workers(svc)
    return page("workers.html", viewer=who, nav="workers", workers=live,
                queues=svc.activity.queues(who.scope), now=datetime.now(UTC),
                serving=lambda p: sum(w.serves(p) for w in live or ()))


@router.get("/usage")
@signed_in
def usage(days: Literal[1, 7, 30] = Query(default=7), svc: Services = Depends(services),
          who: Viewer = Depends(viewer)) -> Response:
    return page("usage.html", viewer=who, nav="usage", days=days,
                rows=figures.usage(svc, who.scope, days))
