"""Liveness, readiness (database, broker, object store) and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..deps import Services, services
from ..guard import GuardedRoute, public

router = APIRouter(route_class=GuardedRoute)
# On the API's port only with OMNIJOBS_METRICS_PUBLIC=true (else `api --metrics-port`).
metrics_router = APIRouter(route_class=GuardedRoute)


@router.get("/healthz")
@public
def healthz() -> dict:
    return {"status": "ok"}


@router.get("/readyz")
@public
def readyz(svc: Services = Depends(services)) -> JSONResponse:
    checks = {}
    for name, check in svc.ready_checks.items():
        try:
            check()
            checks[name] = "ok"
        except Exception as exc:
            checks[name] = f"error: {type(exc).__name__}"
    ok = all(v == "ok" for v in checks.values())
    return JSONResponse({"status": "ok" if ok else "unavailable", "checks": checks},
                        status_code=200 if ok else 503)


@metrics_router.get("/metrics")
@public
def metrics() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
