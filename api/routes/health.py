"""Liveness, readiness (database, broker, object store) and Prometheus metrics."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..deps import Services, services
from ..guard import GuardedRoute, public

router = APIRouter(route_class=GuardedRoute)
# On the API's port only with OMNIJOBS_METRICS_PUBLIC=true (else `api --metrics-port`).
metrics_router = APIRouter(route_class=GuardedRoute)

CHECK_TIMEOUT_S = 5.0
RETRY_AFTER_S = "5"
_checks = ThreadPoolExecutor(max_workers=4, thread_name_prefix="readyz")


@router.get("/healthz")
@public
def healthz() -> dict:
    return {"status": "ok"}


@router.get("/readyz")
@public
def readyz(svc: Services = Depends(services)) -> JSONResponse:
    """Each dependency checked at once, each within a bound; a 503 names the ones that
    failed (``failed``) and why (``checks``)."""
    futures = {name: _checks.submit(check) for name, check in svc.ready_checks.items()}
    checks = {}
    for name, future in futures.items():
        try:
            future.result(timeout=CHECK_TIMEOUT_S)
            checks[name] = "ok"
        except FutureTimeout:
            checks[name] = f"error: no answer in {CHECK_TIMEOUT_S:g}s"
        except Exception as exc:
            checks[name] = f"error: {type(exc).__name__}"
    failed = sorted(name for name, state in checks.items() if state != "ok")
    if not failed:
        return JSONResponse({"status": "ok", "checks": checks})
    return JSONResponse({"status": "unavailable", "failed": failed, "checks": checks},
                        status_code=503, headers={"Retry-After": RETRY_AFTER_S})


@metrics_router.get("/metrics")
@public
def metrics() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
