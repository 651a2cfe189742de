"""Liveness, readiness (database, broker, object store) and Prometheus metrics."""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

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
    failed (``failed``) and why (``checks``). ``workers`` counts the live workers taking
    each enabled pipeline's jobs and ``unserved`` names those none takes: reported, not a
    503, since this process serves them all the same (their jobs wait, and a fleet
    scaled to zero starts workers when they do)."""
    futures = {name: _checks.submit(check) for name, check in svc.ready_checks.items()}
    if svc.fleet is not None:
        serving = _checks.submit(svc.fleet.workers.serving, svc.settings.pipelines)
    checks = {name: _outcome(future) for name, future in futures.items()}
    body: dict = {"checks": checks}
    if svc.fleet is not None and _outcome(serving) == "ok":
        counts = serving.result()
        body["workers"] = {name: counts[name] for name in svc.settings.pipelines}
        body["unserved"] = [name for name in svc.settings.pipelines if not counts[name]]
    failed = sorted(name for name, state in checks.items() if state != "ok")
    if not failed:
        return JSONResponse({"status": "ok", **body})
    return JSONResponse({"status": "unavailable", "failed": failed, **body},
                        status_code=503, headers={"Retry-After": RETRY_AFTER_S})


def _outcome(future: Future) -> str:
    try:
        future.result(timeout=CHECK_TIMEOUT_S)
        return "ok"
    except FutureTimeout:
        return f"error: no answer in {CHECK_TIMEOUT_S:g}s"
    except Exception as exc:
        return f"error: {type(exc).__name__}"


@metrics_router.get("/metrics")
@public
def metrics() -> Response:
    return Response(generate_latest(_registry()), media_type=CONTENT_TYPE_LATEST)


def _registry():
    """This process's metrics; with ``omnijobs api --workers N`` (multiprocess mode,
    ``PROMETHEUS_MULTIPROC_DIR`` set) the sum over all N, whichever one answers."""
    folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not folder:
        return REGISTRY
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=folder)
    return registry
