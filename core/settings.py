"""One Settings object, read from ``OMNIJOBS_*`` environment variables.

The defaults are the embedded mode: SQLite, a filesystem broker and a local-disk
object store under ``./.omnijobs``, so ``omnijobs dev`` runs with nothing installed.
Production sets ``OMNIJOBS_MODE=production``; then placeholder secrets are refused.
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


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="OMNIJOBS_", extra="ignore")

    mode: Literal["embedded", "production"] = "embedded"
    home: Path = Path(".omnijobs")

    database_url: str | None = None
    broker_url: str | None = None

    object_store: Literal["local", "s3"] = "local"
    s3_endpoint_url: str | None = None
    s3_public_endpoint_url: str | None = Field(
        default=None, description="Endpoint used when presigning, if clients reach S3 elsewhere")
    s3_bucket: str = "omnijobs"
    s3_region: str = "us-east-1"
    s3_access_key_id: str | None = None
    s3_secret_access_key: str | None = Field(default=None, repr=False)
    s3_addressing_style: Literal["path", "virtual", "auto"] = "path"
    s3_create_bucket: bool = True

    public_base_url: str = "http://127.0.0.1:8000"
    signing_secret: str = Field(default="dev-insecure-signing-secret", repr=False)
    signed_url_ttl_s: int = Field(default=3600, ge=1, le=7 * 24 * 3600)

    sync_wait_default_s: float = Field(default=60.0, ge=0)
    sync_wait_max_s: float = Field(default=300.0, ge=0)

    lease_s: float = Field(default=60.0, gt=0)
    max_attempts: int = Field(default=3, ge=1)
    retry_backoff_s: float = Field(default=2.0, ge=0)
    outbox_grace_s: float = Field(default=10.0, ge=0)
    finalize_backlog: int = Field(default=1, ge=0)
    stale_queued_s: float = Field(default=900.0, gt=0)

    # ---- maintenance, bounded work and retention -------------------------------------
    # Seconds between runs of each maintenance step (keys as in tasks/maintenance.py's
    # PERIODS: relay, reap, sweep_queued, orphans, retention, prune_outbox).
    maintenance_periods: dict[str, float] = {}
    outbox_retention_s: float = Field(default=86400.0, gt=0)  # published rows kept this long
    output_ttl_s: float = Field(default=7 * 86400.0, gt=0)  # objects deleted after completion
    job_ttl_s: float = Field(default=30 * 86400.0, gt=0)  # finished job records deleted
    storage_retry_s: float = Field(default=120.0, ge=0)  # uploads retried in place this long

    pipelines: list[str] = ["piper-joe", "reference-t2va"]
    pipeline_modules: list[str] = []
    model_aliases: dict[str, str] = DEFAULT_ALIASES
    pipeline_options: dict[str, dict[str, Any]] = {}

    # ---- webhooks -------------------------------------------------------------------
    webhook_retry_schedule_s: list[float] = Field(
        default=list(WEBHOOK_RETRY_SCHEDULE_S), min_length=1, max_length=50,
        description="Delay before each delivery attempt (the first is the initial one)")
    webhook_timeout_s: float = Field(default=15.0, gt=0, le=120)
    webhook_allowed_networks: list[str] | None = Field(
        default=None, description="CIDRs webhooks may reach despite the SSRF guard; "
        "default: loopback in the embedded mode, none in production")

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
    max_body_bytes: int = Field(default=1 << 20, ge=1024)
    api_threads: int = Field(default=40, ge=1, le=1000)
    db_pool_timeout_s: float = Field(default=5.0, gt=0)
    auth_cache_ttl_s: float = Field(default=5.0, ge=0, le=10)
    tenant_max_active: int = Field(default=1000, ge=1)
    pipeline_max_queued: int = Field(default=10_000, ge=1)
    tenant_submits_per_s: float | None = Field(default=None, ge=0)
    tenant_submit_burst: int | None = Field(default=None, ge=1)
    metrics_public: bool = False

    # ---- what a person sees ---------------------------------------------------------
    log_format: Literal["json", "text"] = "json"

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
        return self

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
    def objects_dir(self) -> Path:
        return (self.home / "objects").resolve()
