"""SQLAlchemy 2.0 models. The schema changes only through Alembic migrations."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator


class UTCDateTime(TypeDecorator):
    """Timestamps are always UTC-aware in Python, whatever the backend returns.

    SQLite has no time zone type: it gets naive UTC strings (which still sort and
    compare correctly), PostgreSQL gets ``timestamptz``.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value, dialect):
        if value is None:
            return None
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value, dialect):
        if value is None or value.tzinfo is not None:
            return value
        return value.replace(tzinfo=UTC)


class Base(DeclarativeBase):
    pass


INTERACTIVE_JOB = text("batch_id IS NULL")  # a job of no batch
# The queue signals' partial indexes: only queued jobs, one index per lane.
QUEUED_INTERACTIVE = text("status = 'queued' AND batch_id IS NULL")
QUEUED_BULK = text("status = 'queued' AND batch_id IS NOT NULL")
# The deadline sweep's index: queued jobs that carry a start deadline, by deadline.
QUEUED_WITH_DEADLINE = text("status = 'queued' AND start_by IS NOT NULL")
# The sweeps' partial indexes: retention's outputs still to delete, and queued jobs by
# their last change (the stale-queued sweep). The sweeps' queries spell the predicates
# out as literals, so the planner can prove the index applies whatever plan it caches.
QUEUED = text("status = 'queued'")
OUTPUTS_KEPT = text("expires_at IS NOT NULL AND outputs_deleted_at IS NULL")


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # Its share of each lane against the other tenants waiting there (``tenants weight``).
    share_weight: Mapped[float] = mapped_column(Float, default=1.0, server_default="1")


class TenantService(Base):
    """How much service a tenant has had in one pipeline's lane: its stride-scheduling
    pass (every claim adds ``1 / share_weight``). The fair claim serves the waiting
    tenant with the lowest pass; ``lane_clocks`` keeps a returning tenant from
    replaying the service it missed while it was away."""

    __tablename__ = "tenant_service"

    pipeline: Mapped[str] = mapped_column(String(200), primary_key=True)
    lane: Mapped[str] = mapped_column(String(16), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True)
    pass_: Mapped[float] = mapped_column("pass", Float)


class LaneClock(Base):
    """One pipeline's lane: the pass of the last tenant served (its virtual time), and
    the row every claim in the lane locks first, so claims in a lane take turns."""

    __tablename__ = "lane_clocks"

    pipeline: Mapped[str] = mapped_column(String(200), primary_key=True)
    lane: Mapped[str] = mapped_column(String(16), primary_key=True)
    vtime: Mapped[float] = mapped_column(Float)


class ApiKey(Base):
    """Keys are stored as SHA-256 hashes; only the prefix is kept in clear for display."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    prefix: Mapped[str] = mapped_column(String(16))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # An operator's key: the console shows it every tenant (``keys create --operator``).
    operator: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class ConsoleSession(Base):
    """A browser signed in to the console with a key. Only the SHA-256 of the cookie's
    token is stored; the row goes with its key (revoked keys end their sessions too)."""

    __tablename__ = "console_sessions"
    __table_args__ = (Index("ix_console_sessions_last_seen", "last_seen_at"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    key_id: Mapped[str] = mapped_column(ForeignKey("api_keys.id", ondelete="CASCADE"))
    csrf: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    last_seen_at: Mapped[datetime] = mapped_column(UTCDateTime())


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("tenant_id", "idempotency_key", name="uq_jobs_tenant_idempotency"),
        Index("ix_jobs_tenant_created", "tenant_id", "created_at", "id"),
        Index("ix_jobs_status_lease", "status", "lease_expires_at"),
        # The submit path's quota counts: active jobs per tenant, queued jobs per pipeline
        # (interactive ones: a batch's jobs have their own quota).
        Index("ix_jobs_tenant_status", "tenant_id", "status", postgresql_where=INTERACTIVE_JOB,
              sqlite_where=INTERACTIVE_JOB),
        Index("ix_jobs_pipeline_status", "pipeline", "status", postgresql_where=INTERACTIVE_JOB,
              sqlite_where=INTERACTIVE_JOB),
        Index("ix_jobs_expires", "expires_at"),
        Index("ix_jobs_completed", "completed_at"),
        Index("ix_jobs_batch_status", "batch_id", "status"),
        # Queue depth and oldest age per pipeline and lane (storage/repositories/queues.py):
        # an index-only scan of the queued jobs alone, however many finished ones exist.
        Index("ix_jobs_queued_interactive", "pipeline", "created_at",
              postgresql_where=QUEUED_INTERACTIVE, sqlite_where=QUEUED_INTERACTIVE),
        Index("ix_jobs_queued_bulk", "pipeline", "created_at",
              postgresql_where=QUEUED_BULK, sqlite_where=QUEUED_BULK),
        Index("ix_jobs_queued_start_by", "start_by", postgresql_where=QUEUED_WITH_DEADLINE,
              sqlite_where=QUEUED_WITH_DEADLINE),
        Index("ix_jobs_outputs_due", "expires_at", postgresql_where=OUTPUTS_KEPT,
              sqlite_where=OUTPUTS_KEPT),
        Index("ix_jobs_queued_updated", "updated_at", postgresql_where=QUEUED,
              sqlite_where=QUEUED),
        # The fair claim: a tenant's oldest queued job per pipeline and lane, and the job
        # holding a render message's dispatch token.
        Index("ix_jobs_fair_interactive", "pipeline", "tenant_id", "created_at",
              postgresql_where=QUEUED_INTERACTIVE, sqlite_where=QUEUED_INTERACTIVE),
        Index("ix_jobs_fair_bulk", "pipeline", "tenant_id", "created_at",
              postgresql_where=QUEUED_BULK, sqlite_where=QUEUED_BULK),
        Index("ix_jobs_queued_token", "dispatch_token",
              postgresql_where=QUEUED, sqlite_where=QUEUED),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(16))
    model: Mapped[str] = mapped_column(String(200))
    pipeline: Mapped[str] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16))
    progress: Mapped[int] = mapped_column(Integer, default=0)
    request: Mapped[dict] = mapped_column(JSON)
    metadata_: Mapped[dict | None] = mapped_column("metadata", JSON)
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer)
    error_code: Mapped[str | None] = mapped_column(String(64))
    error_message: Mapped[str | None] = mapped_column(Text)
    worker_id: Mapped[str | None] = mapped_column(String(200))
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # The render message that may claim the job (older copies are no-ops), when the
    # outputs expire (set at completion) and when maintenance deleted their objects.
    dispatch_token: Mapped[str | None] = mapped_column(String(32))
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    outputs_deleted_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # A retry's backoff: no claim takes the job before then (None: at once).
    ready_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # A batch's request: its batch, its line (0-based) and the caller's custom_id.
    batch_id: Mapped[str | None] = mapped_column(ForeignKey(
        "batches.id", ondelete="CASCADE", name="fk_jobs_batch_id"))
    batch_index: Mapped[int | None] = mapped_column(Integer)
    custom_id: Mapped[str | None] = mapped_column(String(512))
    # The caller's deadlines: started by ``start_by`` (else ``expired``), and each attempt
    # run at most ``max_run_s`` (else ``cancelled`` with ``deadline_exceeded``).
    start_by: Mapped[datetime | None] = mapped_column(UTCDateTime())
    max_run_s: Mapped[float | None] = mapped_column(Float)

    outputs: Mapped[list[Output]] = relationship(
        back_populates="job", order_by="Output.index", lazy="selectin",
        cascade="all, delete-orphan")
    usage: Mapped[JobUsage | None] = relationship(
        primaryjoin="Job.id == foreign(JobUsage.job_id)", viewonly=True, uselist=False,
        lazy="selectin")


class JobAttempt(Base):
    """One attempt of a job: who claimed it and when, and how it ended (a job row keeps
    only its latest attempt). Written in the transactions of the job's transitions."""

    __tablename__ = "job_attempts"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"),
                                        primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    worker_id: Mapped[str | None] = mapped_column(String(200))
    claimed_at: Mapped[datetime] = mapped_column(UTCDateTime())
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    outcome: Mapped[str | None] = mapped_column(String(16))
    error_code: Mapped[str | None] = mapped_column(String(64))
    error_message: Mapped[str | None] = mapped_column(Text)
    # The worker's wall time in the pipeline for this attempt, and where it ran.
    render_s: Mapped[float | None] = mapped_column(Float)
    device: Mapped[str | None] = mapped_column(String(200))


class JobUsage(Base):
    """What a finished job cost, written in the transaction that ended it (and again if
    a worker reports a cancelled attempt's time afterwards). No foreign key to the job:
    the record outlives the job's retention, as a bill must."""

    __tablename__ = "job_usage"
    __table_args__ = (Index("ix_job_usage_tenant_finished", "tenant_id", "finished_at"),)

    job_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(16))
    model: Mapped[str] = mapped_column(String(200))
    pipeline: Mapped[str] = mapped_column(String(200))
    batch_id: Mapped[str | None] = mapped_column(String(40))
    status: Mapped[str] = mapped_column(String(16))
    finished_at: Mapped[datetime] = mapped_column(UTCDateTime())
    attempts: Mapped[int] = mapped_column(Integer)
    render_s: Mapped[float] = mapped_column(Float)  # every attempt's
    failed_render_s: Mapped[float] = mapped_column(Float)  # the part no output came of
    device: Mapped[str | None] = mapped_column(String(200))
    characters: Mapped[int] = mapped_column(Integer)
    audio_s: Mapped[float] = mapped_column(Float)
    video_s: Mapped[float] = mapped_column(Float)
    frames: Mapped[int] = mapped_column(Integer)
    bytes: Mapped[int] = mapped_column(BigInteger)


class Output(Base):
    __tablename__ = "outputs"
    __table_args__ = (UniqueConstraint("job_id", "index", "variant",
                                       name="uq_outputs_job_index_variant"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    index: Mapped[int] = mapped_column(Integer)
    # "main": the output itself; "thumbnail" or "spritesheet": a preview of video ``index``
    variant: Mapped[str] = mapped_column(String(16), server_default="main")
    key: Mapped[str] = mapped_column(String(500))
    content_type: Mapped[str] = mapped_column(String(100))
    bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    duration_s: Mapped[float | None] = mapped_column(Float)
    sample_rate: Mapped[int | None] = mapped_column(Integer)
    channels: Mapped[int | None] = mapped_column(Integer)
    width: Mapped[int | None] = mapped_column(Integer)
    height: Mapped[int | None] = mapped_column(Integer)
    fps: Mapped[float | None] = mapped_column(Float)
    frames: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())

    job: Mapped[Job] = relationship(back_populates="outputs")


class OutboxMessage(Base):
    """A message to publish, written in the same transaction as the state it announces.

    If the broker is down when a job is submitted, the row stays unpublished and the
    relay publishes it later: a committed job is never lost to a broker outage.
    """

    __tablename__ = "outbox"
    __table_args__ = (Index("ix_outbox_unpublished", "published_at", "available_at"),
                      Index("ix_outbox_job_id", "job_id"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    topic: Mapped[str] = mapped_column(String(32))
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    queue: Mapped[str] = mapped_column(String(200))
    payload: Mapped[dict] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    available_at: Mapped[datetime] = mapped_column(UTCDateTime())
    published_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


# ---- webhooks ----------------------------------------------------------------------

class WebhookEndpoint(Base):
    """A registered endpoint (OpenAI's webhook_endpoint): receives its tenant's events."""

    __tablename__ = "webhook_endpoints"
    __table_args__ = (Index("ix_webhook_endpoints_tenant_created", "tenant_id", "created_at",
                            "id"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(256))
    url: Mapped[str] = mapped_column(Text)
    event_types: Mapped[list] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    disabled_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class WebhookSecret(Base):
    """The signing secret of an endpoint (``owner_id`` = its id) or a tenant's default
    secret for per-job URLs (``owner_id`` = the tenant's id). Kept in clear: signing
    needs it. A rotation keeps the previous one until ``previous_expires_at``."""

    __tablename__ = "webhook_secrets"

    owner_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    secret: Mapped[str] = mapped_column(String(100))
    previous_secret: Mapped[str | None] = mapped_column(String(100))
    previous_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class JobWebhook(Base):
    """A job's own callback URL (``webhook_url`` at submit), stored with the job."""

    __tablename__ = "job_webhooks"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"),
                                        primary_key=True)
    url: Mapped[str] = mapped_column(Text)
    event_types: Mapped[list] = mapped_column(JSON)
    stopped_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class WebhookEvent(Base):
    """An event, written in the transaction of the transition it reports. No foreign
    key to the job: a deleted video's ``cancelled`` event still goes out."""

    __tablename__ = "webhook_events"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    job_id: Mapped[str] = mapped_column(String(40), index=True)
    type: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class WebhookDelivery(Base):
    """One event to one target (an endpoint, or the job's own URL), retried until it
    succeeds, is stopped or runs out of attempts. ``lock_token``/``locked_until`` mark
    the one dispatch in flight; an expired lock is dispatched again."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (Index("ix_webhook_deliveries_due", "status", "next_attempt_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    event_id: Mapped[str] = mapped_column(ForeignKey("webhook_events.id", ondelete="CASCADE"),
                                          index=True)
    endpoint_id: Mapped[str | None] = mapped_column(
        ForeignKey("webhook_endpoints.id", ondelete="CASCADE"))
    url: Mapped[str | None] = mapped_column(Text)
    target: Mapped[str] = mapped_column(String(40))
    status: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    locked_until: Mapped[datetime | None] = mapped_column(UTCDateTime())
    lock_token: Mapped[str | None] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


class WebhookAttempt(Base):
    """One HTTP attempt of a delivery, for the delivery log."""

    __tablename__ = "webhook_attempts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    delivery_id: Mapped[int] = mapped_column(
        ForeignKey("webhook_deliveries.id", ondelete="CASCADE"), index=True)
    attempted_at: Mapped[datetime] = mapped_column(UTCDateTime())
    url_host: Mapped[str] = mapped_column(String(300))
    status_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(String(300))
    duration_ms: Mapped[int] = mapped_column(Integer)
    next_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


# ---- files and batches ---------------------------------------------------------------

class File(Base):
    """An OpenAI file: a batch input (``purpose=batch``) or a batch's output or error file
    (``batch_output``). The bytes live in the object store under ``key`` until
    ``expires_at``; then they are deleted and ``expired_at`` set, the row kept."""

    __tablename__ = "files"
    __table_args__ = (Index("ix_files_tenant_created", "tenant_id", "created_at", "id"),
                      Index("ix_files_expires_at", "expires_at"))

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    purpose: Mapped[str] = mapped_column(String(32))
    filename: Mapped[str] = mapped_column(String(255))
    bytes: Mapped[int] = mapped_column(BigInteger)
    key: Mapped[str] = mapped_column(String(500))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    expired_at: Mapped[datetime | None] = mapped_column(UTCDateTime())  # bytes deleted


class Batch(Base):
    """An OpenAI batch. Its requests are jobs (``jobs.batch_id``) and, for lines whose body
    the endpoint refused, rejections. ``lease_*`` marks the one process validating or
    finalizing it; a lease that runs out is taken over."""

    __tablename__ = "batches"
    __table_args__ = (Index("ix_batches_tenant_created", "tenant_id", "created_at", "id"),
                      Index("ix_batches_status", "status"))

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    endpoint: Mapped[str] = mapped_column(String(32))
    input_file_id: Mapped[str] = mapped_column(String(40))
    completion_window: Mapped[str] = mapped_column(String(8))
    status: Mapped[str] = mapped_column(String(16))
    metadata_: Mapped[dict | None] = mapped_column("metadata", JSON)
    errors: Mapped[list | None] = mapped_column(JSON)
    output_file_id: Mapped[str | None] = mapped_column(String(40))
    error_file_id: Mapped[str | None] = mapped_column(String(40))
    total: Mapped[int] = mapped_column(Integer, default=0)
    completed: Mapped[int] = mapped_column(Integer, default=0)
    failed: Mapped[int] = mapped_column(Integer, default=0)
    rejected: Mapped[int] = mapped_column(Integer, default=0)
    lease_token: Mapped[str | None] = mapped_column(String(32))
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
    in_progress_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finalizing_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    failed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    expired_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    cancelling_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    cancelled_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # OpenAI's output_expires_after: the output and error files expire this long after
    # they are written (None: OMNIJOBS_FILE_TTL_S)
    output_expires_after_s: Mapped[int | None] = mapped_column(Integer)


class BatchRejection(Base):
    """A batch line whose body the endpoint refused: the answer it would have given."""

    __tablename__ = "batch_rejections"

    batch_id: Mapped[str] = mapped_column(ForeignKey("batches.id", ondelete="CASCADE"),
                                          primary_key=True)
    line: Mapped[int] = mapped_column(Integer, primary_key=True)
    custom_id: Mapped[str] = mapped_column(String(512))
    status_code: Mapped[int] = mapped_column(Integer)
    body: Mapped[dict] = mapped_column(JSON)


# ---- the fleet -----------------------------------------------------------------------

class Worker(Base):
    """A process of the fleet (a render worker or the maintenance process) as its own
    heartbeat last described it. A row whose ``expires_at`` has passed is a dead process:
    readers leave it out, maintenance deletes it later."""

    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(200), primary_key=True)
    role: Mapped[str] = mapped_column(String(16))
    host: Mapped[str] = mapped_column(String(200))
    pid: Mapped[int] = mapped_column(Integer)
    pipelines: Mapped[list] = mapped_column(JSON)
    device: Mapped[str | None] = mapped_column(String(200))
    version: Mapped[str] = mapped_column(String(64))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime())
    heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
    job_id: Mapped[str | None] = mapped_column(String(40))
    draining_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
