"""One Settings object, read from ``OMNIJOBS_*`` environment variables.

The defaults are the embedded mode: SQLite, a filesystem broker and a local-disk
object store under ``./.omnijobs``, so ``omnijobs dev`` runs with nothing installed.
Production sets ``OMNIJOBS_MODE=production``; then placeholder secrets are refused, and
so is a local object store that was not asked for by name.
"""

from __future__ import annotations

import ipaddress
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

PLACEHOLDER_SECRETS = frozenset({"", "change-me", "dev-insecure-signing-secret", "minioadmin",
                                 "omnijobs", "secret", "password"})

DEFAULT_ALIASES = {
    "tts-1": "piper-joe",
    "tts-1-hd": "piper-joe",
    "gpt-4o-mini-tts": "piper-joe",
    "sora-2": "reference-t2va",
    "sora-2-pro": "reference-t2va",
}

# Immediately, 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 14 h, 20 h, 24 h (each after the last try).
WEBHOOK_RETRY_SCHEDULE_S = (0, 5, 300, 1800, 7200, 18000, 36000, 50400, 72000, 86400)


# The settings that only the S3 store reads (a local store beside any of them is refused
# in production).
S3_SETTINGS = ("s3_endpoint_url", "s3_public_endpoint_url", "s3_bucket", "s3_region",
               "s3_access_key_id", "s3_secret_access_key", "s3_addressing_style",
               "s3_create_bucket")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="OMNIJOBS_", extra="ignore")

    # Each field's description is its row in docs/configuration.md's table
    # (`omnijobs config --markdown` prints the table; tests/test_config_table.py checks it).
    mode: Literal["embedded", "production"] = Field(
        "embedded", description="`production` refuses placeholder secrets and requires "
        "OMNIJOBS_DATABASE_URL, OMNIJOBS_BROKER_URL and OMNIJOBS_OBJECT_STORE")
    home: Path = Field(Path(".omnijobs"), description="Embedded state: the SQLite file, the "
                       "broker folder, local objects and `omnijobs dev`'s key (`dev-api-key`)")

    database_url: str | None = Field(
        None, description="e.g. `postgresql://user:pw@host/db`; unset: the SQLite file "
        "`omnijobs.db` under OMNIJOBS_HOME")
    broker_url: str | None = Field(
        None, description="e.g. `redis://host:6379/0`; unset: a filesystem broker under "
        "OMNIJOBS_HOME")

    object_store: Literal["local", "s3"] = Field(
        "local", description="`local` (files under OMNIJOBS_HOME, URLs signed by the API) or "
        "`s3` (any S3-compatible store); production takes `local` only when it is set, and "
        "never beside OMNIJOBS_S3_* variables")
    s3_endpoint_url: str | None = Field(
        None, description="Where workers upload, e.g. `http://seaweedfs:8333`; unset: AWS")
    s3_public_endpoint_url: str | None = Field(
        None, description="Endpoint used when presigning, if clients reach S3 elsewhere; "
        "unset: OMNIJOBS_S3_ENDPOINT_URL")
    s3_bucket: str = Field("omnijobs", description="Bucket of the outputs")
    s3_region: str = Field("us-east-1", description="Region the requests are signed for")
    s3_access_key_id: str | None = Field(None, description="S3 credentials")
    s3_secret_access_key: str | None = Field(
        None, repr=False, description="S3 credentials (a real one is required in production)")
    s3_addressing_style: Literal["path", "virtual", "auto"] = Field(
        "path", description="`path`, `virtual` or `auto`")
    s3_create_bucket: bool = Field(
        True, description="Create the bucket at start-up if it is missing (turn off where the "
        "credentials may not create buckets)")

    public_base_url: str = Field(
        "http://127.0.0.1:8000", description="Base of the local store's signed URLs "
        "(`omnijobs dev` sets it to its own address)")
    port: int = Field(
        8000, ge=1, le=65535, description="Port `omnijobs dev` and `omnijobs api` listen on "
        "when `--port` is not given (`make dev PORT=8137` passes `--port`)")
    signing_secret: str = Field(
        "dev-insecure-signing-secret", repr=False, description="HMAC key of the local "
        "store's signed URLs; production requires a real one of 16+ characters")
    signed_url_ttl_s: int = Field(
        3600, ge=1, le=7 * 24 * 3600, description="Lifetime of signed output URLs (at most "
        "7 days)")

    sync_wait_default_s: float = Field(
        60.0, ge=0, description="How long `POST /v1/audio/speech` waits for its job without "
        "`Prefer: wait`")
    sync_wait_max_s: float = Field(300.0, ge=0,
                                   description="The most a `Prefer: wait=N` may ask for")

    event_stream_max_s: float = Field(
        600.0, gt=0, description="The longest one event or audio stream stays open (SSE "
        "clients resume with `Last-Event-ID`)")
    event_heartbeat_s: float = Field(
        15.0, gt=0, description="A comment line is sent on an idle event stream this often, "
        "so proxies keep the connection")
    event_resync_s: float = Field(
        2.0, gt=0, description="An API process checks the jobs its waits and streams watch "
        "this often, in one query for all, even without a notice (a notice lost in transit "
        "is replayed)")

    lease_s: float = Field(
        60.0, gt=0, description="A running job's lease, renewed by its worker's heartbeat; "
        "a dead worker's job is re-queued once it runs out")
    max_attempts: int = Field(3, ge=1, description="Attempts per job (retryable failures "
                              "only)")
    retry_backoff_s: float = Field(2.0, ge=0, description="Base delay before a retry "
                                   "(doubling, with jitter)")
    outbox_grace_s: float = Field(
        10.0, ge=0, description="The relay leaves a job's message this long to the API "
        "that wrote it before publishing it itself")
    finalize_backlog: int = Field(
        1, ge=0, description="Generated results that may wait for a worker's background "
        "finalize thread")
    stale_queued_s: float = Field(
        900.0, gt=0, description="A job queued this long after its message went out gets a "
        "new one, if the broker no longer holds it")

    # ---- the fleet: registry, drain, queue signals ---------------------------------------
    worker_heartbeat_s: float = Field(
        10.0, gt=0, description="How often each worker and the maintenance process write "
        "their row of the worker registry; a row not renewed for three periods is a dead "
        "process and drops out")
    drain_s: float | None = Field(
        None, ge=0, description="On SIGTERM (or SIGINT) a worker claims nothing more and "
        "finishes its job within this many seconds, else hands it back to the queue and "
        "exits; unset: the pipeline's maximum runtime")
    visibility_timeout_s: float | None = Field(
        None, gt=0, description="Redis redelivers a message a worker took but did not "
        "acknowledge after this long; unset: the longest maximum runtime of the enabled "
        "pipelines plus 15 minutes, so a live worker's message is never redelivered")
    fleet_metrics_cache_s: float = Field(
        2.0, ge=0, description="The queue gauges (`omnijobs_queue_depth` and the rest) are "
        "read from the database at most this often, however many scrapers ask")
    fleet_rate_window_s: float = Field(
        300.0, gt=0, description="The window of `omnijobs_queue_completion_rate`: completions "
        "per second over the last this many seconds")

    # ---- maintenance, bounded work and retention -------------------------------------
    maintenance_periods: dict[str, float] = Field(
        {}, description="Seconds between maintenance steps (JSON), over the defaults `relay` "
        "5, `reap` 10, `sweep_queued` 60, `retention` 600, `orphans` 3600, `prune_outbox` "
        "3600, `webhooks` 1, `batches` 0.5, `prune_workers` 600")
    outbox_retention_s: float = Field(
        86400.0, gt=0, description="Published outbox rows are deleted after this long")
    output_ttl_s: float = Field(
        7 * 86400.0, gt=0, description="Outputs' objects are deleted this long after "
        "completion (`expires_at`): 7 days")
    job_ttl_s: float = Field(
        30 * 86400.0, gt=0, description="Finished jobs' records are deleted this long after "
        "they ended: 30 days")
    storage_retry_s: float = Field(
        120.0, ge=0, description="An upload to an unreachable store is retried in place "
        "this long")

    pipelines: list[str] = Field(
        ["piper-joe", "reference-t2va"], description="Enabled pipelines (JSON list): the "
        "models the API serves, and what `omnijobs worker` runs without `--pipeline`")
    pipeline_modules: list[str] = Field(
        [], description="Extra modules that register pipelines (JSON list)")
    model_aliases: dict[str, str] = Field(
        DEFAULT_ALIASES, description="Model ids mapped to a served model or pipeline (JSON); "
        "what is set here is merged over the defaults, replacing an alias of the same name")
    pipeline_options: dict[str, dict[str, Any]] = Field(
        {}, description="Per-pipeline options (JSON), e.g. model path and deploy config for "
        "the GPU pipelines, `max_runtime_s`")

    # ---- webhooks -------------------------------------------------------------------
    webhook_retry_schedule_s: list[float] = Field(
        list(WEBHOOK_RETRY_SCHEDULE_S), min_length=1, max_length=50,
        description="Delay before each delivery attempt, after the previous one (JSON; "
        "starts with 0; its length is the number of attempts)")
    webhook_timeout_s: float = Field(15.0, gt=0, le=120,
                                     description="Time allowed for one delivery attempt")
    webhook_allowed_networks: list[str] | None = Field(
        None, description="CIDRs that webhook URLs may reach despite the SSRF guard (JSON "
        "list); unset: loopback in the embedded mode, none in production")

    @field_validator("model_aliases")
    @classmethod
    def _aliases(cls, value: dict[str, str]) -> dict[str, str]:
        """Merged over the defaults: a deployment that adds one alias keeps the OpenAI
        names working."""
        return {**DEFAULT_ALIASES, **value}

    # ---- files and batches -------------------------------------------------------------
    batch_max_file_bytes: int = Field(
        200 * 2**20, ge=1024, description="Largest batch input file (200 MB; `POST /v1/files` "
        "answers 413 above it)")
    batch_max_lines: int = Field(50_000, ge=1, le=1_000_000,
                                 description="Most requests in one batch")
    batch_max_line_bytes: int = Field(
        1 << 20, ge=1024, description="Longest line of a batch input file (1 MB, the API's "
        "own body limit); a longer line is an invalid line, never read whole")
    file_ttl_s: int = Field(
        30 * 86400, ge=3600, description="Files expire this long after they are written "
        "(their bytes deleted, their record kept as `expired`) unless the upload's "
        "`expires_after`, or a batch's `output_expires_after`, says otherwise: 30 days")
    tenant_storage_bytes: int = Field(
        10 * 2**30, ge=1024, description="Bytes a tenant's files may hold in the store "
        "(uploads and batch results, until they expire or are deleted; 10 GiB): an upload "
        "past it is a 413 `storage_quota_exceeded`")
    batch_max_active: int = Field(
        10, ge=1, description="Unfinished batches a tenant may have at once: the bulk quota, "
        "apart from OMNIJOBS_TENANT_MAX_ACTIVE and OMNIJOBS_PIPELINE_MAX_QUEUED, which count "
        "no batch's jobs")

    @field_validator("webhook_retry_schedule_s")
    @classmethod
    def _schedule(cls, value: list[float]) -> list[float]:
        """One delay per attempt, each after the previous try; the first try is
        immediate, so the list starts with 0."""
        if value[0] != 0 or any(d < 0 for d in value):
            raise ValueError("retry delays start with 0 and are never negative")
        return value

    @field_validator("webhook_allowed_networks")
    @classmethod
    def _cidrs(cls, value: list[str] | None) -> list[str] | None:
        for cidr in value or ():
            ipaddress.ip_network(cidr, strict=False)  # ValueError names the bad entry
        return value

    @property
    def webhook_networks(self) -> list[str]:
        if self.webhook_allowed_networks is not None:
            return self.webhook_allowed_networks
        return ["127.0.0.0/8", "::1/128"] if self.mode == "embedded" else []

    # ---- limits, quotas and exposure (SECURITY.md says what each one defends) ----------
    max_body_bytes: int = Field(
        1 << 20, ge=1024, description="Largest request body (JSON and forms); routes that "
        "take files declare their own")
    api_threads: int = Field(
        40, ge=1, le=1000, description="Worker threads of an API process; its database pool "
        "has as many connections")
    db_pool_timeout_s: float = Field(
        5.0, gt=0, description="Wait for a free database connection before answering 503")
    db_connect_timeout_s: int = Field(
        5, ge=2, le=300, description="Connecting to PostgreSQL (TCP and authentication) "
        "gives up after this long (whole seconds, at least 2)")
    db_statement_timeout_s: float = Field(
        10.0, gt=0, description="API processes: the longest one statement may run "
        "(PostgreSQL `statement_timeout`); the API stops waiting for an answer 1 s later, "
        "so a stalled database is a 503 within it")
    db_task_statement_timeout_s: float = Field(
        300.0, gt=0, description="Workers and maintenance: the same bound for their "
        "statements (batch expansion and sweeps run longer ones than any request)")
    redis_timeout_s: float = Field(
        2.0, gt=0, le=60, description="Connecting to Redis and each Redis call (broker, "
        "live bus, rate limiter) give up after this long: a frozen Redis holds nothing "
        "longer")
    auth_cache_ttl_s: float = Field(
        5.0, ge=0, le=10, description="How long an API process trusts a checked key (at most "
        "10): a revoked key is refused within it")
    tenant_max_active: int = Field(
        1000, ge=1, description="Jobs a tenant may have queued or running (a batch's jobs "
        "count against OMNIJOBS_BATCH_MAX_ACTIVE instead)")
    pipeline_max_queued: int = Field(
        10_000, ge=1, description="Jobs that may wait in one pipeline's queue, all tenants "
        "together (a batch's jobs apart)")
    tenant_submits_per_s: float | None = Field(
        None, ge=0, description="Submits per second per tenant (a token bucket, shared "
        "through Redis); `0` turns it off; unset: off in the embedded mode, 50 in production")
    tenant_submit_burst: int | None = Field(
        None, ge=1, description="The token bucket's size; unset: twice the rate")
    tenant_max_streams: int = Field(
        100, ge=1, description="Event streams, streamed speech and synchronous waits a "
        "tenant may hold open at once on one API process (429 above it)")
    metrics_public: bool = Field(
        False, description="Also serve `/metrics` on the API's port (otherwise only on "
        "`--metrics-port`)")
    metrics_tenant_label: bool = Field(
        False, description="Label `omnijobs_render_seconds_total` with the tenant as well as "
        "the pipeline (one series per tenant and pipeline: mind the cardinality)")

    # ---- what a person sees ---------------------------------------------------------
    log_format: Literal["json", "text"] = Field(
        "json", description="`json` (one object per line) or `text` (for a person; "
        "`omnijobs dev` uses it)")
    console_idle_s: float = Field(
        900.0, gt=0, le=86400, description="A console session idle this long is signed out "
        "(15 minutes)")

    @model_validator(mode="after")
    def _refuse_placeholders(self) -> Settings:
        if self.mode == "production":
            if self.signing_secret in PLACEHOLDER_SECRETS or len(self.signing_secret) < 16:
                raise ValueError("OMNIJOBS_SIGNING_SECRET must be set to a real secret "
                                 "(16+ characters) outside the embedded mode")
            if self.object_store == "s3" and (
                    self.s3_secret_access_key in PLACEHOLDER_SECRETS
                    or self.s3_secret_access_key is None):
                raise ValueError("OMNIJOBS_S3_SECRET_ACCESS_KEY must be set to a real secret "
                                 "outside the embedded mode")
            if self.database_url is None or self.broker_url is None:
                raise ValueError("OMNIJOBS_DATABASE_URL and OMNIJOBS_BROKER_URL are required "
                                 "outside the embedded mode")
            self._refuse_unasked_local_store()
        return self

    def _refuse_unasked_local_store(self) -> None:
        """Production keeps outputs on this host's disk only when asked in so many words:
        a missing OMNIJOBS_OBJECT_STORE beside a full set of S3 variables was served from
        the local disk without a word, and one API process's disk is no other's."""
        if self.object_store != "local":
            return
        s3_set = [f"OMNIJOBS_{name.upper()}" for name in S3_SETTINGS
                  if name in self.model_fields_set]
        if "object_store" not in self.model_fields_set:
            hint = f" ({', '.join(s3_set)} set: did you mean `s3`?)" if s3_set else ""
            raise ValueError("OMNIJOBS_OBJECT_STORE is unset: production needs `s3`, or "
                             f"`local` set explicitly for one host's disk{hint}")
        if s3_set:
            raise ValueError(f"OMNIJOBS_OBJECT_STORE is `local`, so {', '.join(s3_set)} "
                             "would be ignored: set OMNIJOBS_OBJECT_STORE=s3 or unset them")

    @property
    def submit_rate(self) -> tuple[float, int]:
        """(tokens per second, bucket size); a rate of 0 means no limit. Unset, it is off
        in the embedded mode and 50/s in production."""
        rate = self.tenant_submits_per_s
        if rate is None:
            rate = 0.0 if self.mode == "embedded" else 50.0
        return rate, self.tenant_submit_burst or max(1, int(2 * rate))

    @cached_property
    def db_url(self) -> str:
        return self.database_url or f"sqlite:///{(self.home / 'omnijobs.db').resolve()}"

    @cached_property
    def broker(self) -> str:
        return self.broker_url or "filesystem://"

    @property
    def broker_folder(self) -> Path:
        return (self.home / "broker").resolve()

    @property
    def live_dir(self) -> Path:
        """The embedded mode's notices and audio chunks (storage/bus/)."""
        return (self.home / "live").resolve()

    @property
    def objects_dir(self) -> Path:
        return (self.home / "objects").resolve()
