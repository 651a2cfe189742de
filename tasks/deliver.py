"""Webhook delivery: build the event, sign it (Standard Webhooks), POST it, schedule the
next try.

Runs on the ``webhooks`` queue, never on a render worker's, so a busy accelerator never
delays a delivery and a slow receiver never delays a render. A periodic tick locks due
deliveries (``WebhookRepository.claim_due``) and sends one task each; a task that dies
leaves its lock to expire, and the tick dispatches the delivery again: no event is lost.

An attempt has a wall-clock deadline (``OMNIJOBS_WEBHOOK_TIMEOUT_S``) over everything:
connect, send, and the response's status line and headers, so a receiver that trickles
its headers a byte at a time (each read well inside any per-read timeout) is cut off
and its socket closed when the deadline passes. The headers are capped by the HTTP
parser (100 kB), the body is never read. Whatever an attempt raises is a failed attempt
with its reason, recorded and retried on schedule, never an attempt that vanishes.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import random
import ssl
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from urllib.parse import urlsplit, urlunsplit

import httpx
from celery import Celery
from standardwebhooks import Webhook

from core.errors import OmniJobsError, WebhookUrlRefused, clip
from core.settings import Settings
from core.ssrf import Resolver, Target, check_url, system_resolver
from storage.batch_views import batch_view
from storage.records import AttemptRecord, DeliveryWork
from storage.repositories.webhooks import FAILED, PENDING, STOPPED, SUCCEEDED, url_host
from storage.views import resource_view

from .dispatch import WEBHOOK_QUEUE
from .metrics import WEBHOOK_DELIVERIES, WEBHOOK_LATENCY, WEBHOOK_REQUEST_SECONDS
from .runtime import WorkerRuntime, get_runtime

log = logging.getLogger(__name__)

DELIVER_TASK = "omnijobs.deliver_webhook"
USER_AGENT = "omnijobs-webhooks/1"
MAX_BODY_BYTES = 20_000
RETRY_AFTER_STATUSES = frozenset({429, 502, 503, 504})
RETRY_AFTER_MAX_S = 24 * 3600.0
JITTER = 0.1  # each scheduled delay is stretched or shrunk by up to 10 %


def lock_s(settings: Settings) -> float:
    """How long a dispatched delivery stays ours: longer than any one attempt takes."""
    return 2 * settings.webhook_timeout_s + 5


# ---- the event ------------------------------------------------------------------------

def _dumps(value: dict) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _without_urls(data: dict) -> dict:
    outputs = [{k: v for k, v in o.items() if k not in ("url", "url_expires_at")}
               for o in data.get("outputs") or []]
    return {**data, "outputs": outputs}


def _without_outputs(data: dict) -> dict:
    return {**data, "outputs": []}


def _without_text(data: dict) -> dict:
    return {**data, **{k: None for k in ("prompt", "metadata") if k in data}}


def event_body(event_id: str, event_type: str, created_at: datetime, data: dict) -> str:
    """OpenAI's event envelope. Over 20 kB, the output URLs go first (then the outputs,
    then free text) and ``data.outputs_truncated`` says so."""
    envelope = {"id": event_id, "object": "event", "type": event_type,
                "created_at": int(created_at.timestamp()), "data": data}
    body = _dumps(envelope)
    for shrink in (_without_urls, _without_outputs, _without_text):
        if len(body.encode()) <= MAX_BODY_BYTES:
            break
        data = {**shrink(data), "outputs_truncated": True}
        body = _dumps({**envelope, "data": data})
    return body


def resource_data(rt: WorkerRuntime, work: DeliveryWork) -> dict:
    """The job (or batch) as ``GET`` shows it now (fresh signed URLs); a job deleted
    since (a video's DELETE) is reported by id only."""
    if work.event_type.startswith("batch."):
        batch = rt.batches.get(work.job_id)
        if batch is not None:
            return batch_view(batch).model_dump(mode="json")
        return {"id": work.job_id, "object": "batch", "deleted": True}
    job = rt.jobs.get(work.job_id)
    if job is None:
        kind = work.event_type.split(".", 1)[0]
        return {"id": work.job_id, "object": "video" if kind == "video" else "job",
                "deleted": True}
    return resource_view(job, rt.store, rt.settings.signed_url_ttl_s).model_dump(mode="json")


# ---- signing and sending --------------------------------------------------------------

def signed_headers(secrets: tuple[str, ...], msg_id: str, timestamp: int, body: str
                   ) -> dict[str, str]:
    """Standard Webhooks headers; during a rotation one signature per valid secret."""
    when = datetime.fromtimestamp(timestamp, UTC)
    signature = " ".join(Webhook(s).sign(msg_id, when, body) for s in secrets)
    return {"webhook-id": msg_id, "webhook-timestamp": str(timestamp),
            "webhook-signature": signature, "content-type": "application/json",
            "user-agent": USER_AGENT}


@dataclass(frozen=True)
class SendResult:
    status_code: int | None
    error: str | None
    duration_ms: int
    retry_after_s: float | None = None


def parse_retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, (parsedate_to_datetime(value) - datetime.now(UTC)).total_seconds())
    except (TypeError, ValueError):
        return None


def _pinned(target: Target) -> tuple[str, dict[str, str], dict]:
    """The URL with the checked address in place of the name, so the connection goes
    where the guard looked (DNS rebinding); Host and TLS SNI keep the (IDNA) name."""
    parts = urlsplit(target.url)
    ip = target.addresses[0]
    netloc = f"[{ip}]:{target.port}" if ":" in ip else f"{ip}:{target.port}"
    url = urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, ""))
    extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
    return url, {"host": target.host_header}, extensions


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The process's one TLS context for deliveries (httpx's defaults: certifi's CAs,
    verification on). Shared by every delivery's client: building one loads the CA
    bundle, 34 ms of CPU, which a client per delivery paid every time."""
    return httpx.create_ssl_context()


async def _post(url: str, body: bytes, headers: dict[str, str], extensions: dict,
                deadline_s: float) -> tuple[int, float | None]:
    """(status, Retry-After) of one POST, all of it within ``deadline_s``: on expiry the
    read is cancelled and the connection closed (TimeoutError)."""
    async with asyncio.timeout(deadline_s), httpx.AsyncClient(
            timeout=deadline_s, follow_redirects=False, trust_env=False,
            verify=tls_context()) as client:
        async with client.stream("POST", url, content=body, headers=headers,
                                 extensions=extensions) as resp:
            return resp.status_code, parse_retry_after(resp.headers.get("retry-after"))


def send(url: str, body: str, headers: dict[str, str], settings: Settings,
         resolver: Resolver = system_resolver) -> SendResult:
    """One POST: SSRF-checked at this moment, no redirects followed, body not read, a
    wall-clock deadline over the whole exchange."""
    started = time.monotonic()

    def result(code: int | None, error: str | None, retry_after: float | None = None):
        return SendResult(code, error, int((time.monotonic() - started) * 1000), retry_after)

    timeout = settings.webhook_timeout_s
    try:
        target = check_url(url, settings.webhook_networks, resolver)
        pinned, host, extensions = _pinned(target)
        code, retry_after = asyncio.run(_post(pinned, body.encode(), {**headers, **host},
                                              extensions, timeout))
        return result(code, None, retry_after)
    except WebhookUrlRefused as exc:
        return result(None, exc.message[:300])
    except (TimeoutError, httpx.TimeoutException):
        return result(None, f"timed out after {timeout:g} s")
    except httpx.HTTPError as exc:
        return result(None, f"{type(exc).__name__}: {clip(str(exc), 200)}")
    except Exception as exc:  # anything else is still this attempt's failure, recorded
        log.warning("webhook attempt to %s raised", url_host(url), exc_info=True)
        return result(None, f"{type(exc).__name__}: {clip(str(exc), 200)}")


def send_test(settings: Settings, url: str, secrets: tuple[str, ...], event_type: str
              ) -> tuple[int | None, str | None]:
    """A sample event sent right away (``POST /v1/webhook_endpoints/{id}/test``)."""
    kind = event_type.split(".", 1)[0]
    event_id = "evt_" + uuid.uuid4().hex
    body = event_body(event_id, event_type, datetime.now(UTC),
                      {"id": f"{kind}_test", "object": kind, "test": True})
    result = send(url, body, signed_headers(secrets, event_id, int(time.time()), body),
                  settings)
    return result.status_code, result.error


# ---- the retry schedule -----------------------------------------------------------------

def next_step(settings: Settings, attempts_before: int, result: SendResult
              ) -> tuple[str, datetime | None]:
    """Only 2xx succeeds; 410 stops the target; else retry on schedule (or when the
    receiver's Retry-After says, for 429/502/503/504) until the schedule runs out."""
    code = result.status_code
    if code is not None and 200 <= code < 300:
        return SUCCEEDED, None
    if code == 410:
        return STOPPED, None
    schedule = settings.webhook_retry_schedule_s
    if attempts_before + 1 >= len(schedule):
        return FAILED, None
    delay = schedule[attempts_before + 1] * random.uniform(1 - JITTER, 1 + JITTER)
    if code in RETRY_AFTER_STATUSES and result.retry_after_s is not None:
        delay = min(result.retry_after_s, RETRY_AFTER_MAX_S)
    return PENDING, datetime.now(UTC) + timedelta(seconds=delay)


# ---- the tasks ----------------------------------------------------------------------------

def dispatch(app: Celery, delivery_id: int, token: str) -> None:
    try:
        app.send_task(DELIVER_TASK, args=[delivery_id, token], queue=WEBHOOK_QUEUE,
                      retry=False)
    except Exception:  # the lock expires and the next tick dispatches it again
        log.warning("broker down; webhook delivery %s waits for the next tick", delivery_id)


def schedule_due(rt: WorkerRuntime, app: Celery) -> int:
    claimed = rt.webhooks.claim_due(lock_s(rt.settings))
    for delivery_id, token in claimed:
        dispatch(app, delivery_id, token)
    return len(claimed)


def attempt(rt: WorkerRuntime, work: DeliveryWork) -> SendResult:
    """Build, sign and send the event. An outage (retryable) propagates: the lock runs
    out and the delivery is dispatched again; any other error is this attempt's failure."""
    started = time.monotonic()
    try:
        body = event_body(work.event_id, work.event_type, work.event_created_at,
                          resource_data(rt, work))
        secret = rt.webhooks.secret_of(work.endpoint_id or work.tenant_id, work.tenant_id)
        now = datetime.now(UTC)
        headers = signed_headers(secret.active(now), work.event_id, int(now.timestamp()),
                                 body)
        return send(work.url, body, headers, rt.settings)
    except Exception as exc:
        if isinstance(exc, OmniJobsError) and exc.retryable:
            raise
        log.warning("webhook %s could not be prepared", work.event_id, exc_info=True)
        return SendResult(None, f"{type(exc).__name__}: the event could not be prepared",
                          int((time.monotonic() - started) * 1000))


def deliver(rt: WorkerRuntime, app: Celery, delivery_id: int, token: str) -> str:
    settings = rt.settings
    work = rt.webhooks.start(delivery_id, token, lock_s(settings))
    if work is None:
        return "skipped"
    now = datetime.now(UTC)
    result = attempt(rt, work)
    status, next_at = next_step(settings, work.attempts, result)
    record = AttemptRecord(attempted_at=now, url_host=url_host(work.url),
                           status_code=result.status_code, error=result.error,
                           duration_ms=result.duration_ms, next_attempt_at=next_at)
    following = rt.webhooks.finish(work, record, status, lock_s(settings))
    if following is None:
        log.warning("webhook delivery %s was taken over while we sent it", work.id)
        return "lost"
    outcome = "retrying" if status == PENDING else status
    WEBHOOK_DELIVERIES.labels(outcome).inc()
    WEBHOOK_REQUEST_SECONDS.observe(result.duration_ms / 1000)
    if status == SUCCEEDED:
        WEBHOOK_LATENCY.observe((datetime.now(UTC) - work.event_created_at).total_seconds())
    log.info("webhook %s to %s: %s (%s)", work.event_id, record.url_host, outcome,
             result.status_code or result.error, extra={"job_id": work.job_id})
    for next_id, next_token in following:
        dispatch(app, next_id, next_token)
    return outcome


def register(app: Celery) -> None:
    @app.task(name=DELIVER_TASK, shared=False, ignore_result=True, acks_late=True)
    def deliver_webhook(delivery_id: int, token: str) -> str:
        return deliver(get_runtime(), app, delivery_id, token)
