"""Jobs, their attempts, usage records and outputs, and the outbox of render messages,
with the partial indexes' predicates the sweeps and signals spell out."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    JSON,
    BigInteger,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from .base import Base, UTCDateTime

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
