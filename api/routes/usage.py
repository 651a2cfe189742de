"""``GET /v1/usage``: the tenant's usage in time buckets, shaped like OpenAI's
organization usage endpoints (a page of buckets, each with its results), summed by the
usage repository from the records each finished job left."""

from __future__ import annotations

import time
from typing import Literal

from fastapi import APIRouter, Depends, Query
from fastapi.concurrency import run_in_threadpool

from core.errors import InvalidRequest, clip
from storage.repositories.usage import GROUPS
from storage.usage_views import UsagePage, usage_page

from ..deps import Services, services, tenant_id
from ..guard import GuardedRoute

router = APIRouter(prefix="/v1/usage", route_class=GuardedRoute)

WIDTHS = {"1h": 3600, "1d": 86400}
LIMITS = {"1h": (24, 168), "1d": (7, 31)}  # OpenAI's (default, most) buckets per page


def group_fields(values: list[str] | None) -> tuple[str, ...]:
    """``group_by=model&group_by=pipeline``, ``group_by[]=model`` or ``model,pipeline``."""
    fields = [v.strip() for value in values or () for v in value.split(",") if v.strip()]
    for f in fields:
        if f not in GROUPS:
            raise InvalidRequest(f"cannot group usage by {clip(f)!r}; choose from "
                                 f"{', '.join(GROUPS)}", param="group_by")
    return tuple(dict.fromkeys(fields))


@router.get("", response_model=UsagePage)
async def get_usage(
        start_time: int = Query(ge=0, le=2**32, description="Start (inclusive), seconds "
                                "since 1970: the first bucket starts here"),
        end_time: int | None = Query(default=None, ge=0, le=2**32, description=(
            "End (exclusive), seconds since 1970; default now (this second included)")),
        bucket_width: Literal["1h", "1d"] = "1d",
        group_by: list[str] | None = Query(default=None, description=(
            "Group each bucket's results by `model`, `pipeline` and/or `batch_id`")),
        group_by_brackets: list[str] | None = Query(default=None, alias="group_by[]",
                                                    include_in_schema=False),
        limit: int | None = Query(default=None, ge=1, description=(
            "Buckets per page: 1h 24 (at most 168), 1d 7 (at most 31)")),
        page: str | None = Query(default=None, max_length=16, description=(
            "The `next_page` of the previous page")),
        svc: Services = Depends(services), tenant: str = Depends(tenant_id)) -> UsagePage:
    end = end_time if end_time is not None else int(time.time()) + 1  # this second too
    if end <= start_time:
        raise InvalidRequest("end_time must be after start_time", param="end_time")
    default, most = LIMITS[bucket_width]
    if limit is not None and limit > most:
        raise InvalidRequest(f"limit is at most {most} for bucket_width {bucket_width}",
                             param="limit")
    width = WIDTHS[bucket_width]
    first = start_time
    if page is not None:
        if not page.isdigit() or not start_time < int(page) < end \
                or (int(page) - start_time) % width:
            raise InvalidRequest("page is not a next_page of this query", param="page")
        first = int(page)
    groups = group_fields([*(group_by or ()), *(group_by_brackets or ())])
    n = limit or default
    stop = min(end, first + n * width)
    rows = await run_in_threadpool(svc.usage.buckets, tenant, first, stop, width, groups)
    return usage_page(rows, first, end, width, n)
