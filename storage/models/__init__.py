"""SQLAlchemy 2.0 models, one module per table group. The schema changes only through
Alembic migrations. Everything is re-exported here: callers import ``storage.models``."""

from .base import Base, UTCDateTime
from .batches import Batch, BatchRejection, File
from .fleet import Worker
from .jobs import (
    INTERACTIVE_JOB,
    OUTPUTS_KEPT,
    QUEUED,
    QUEUED_BULK,
    QUEUED_INTERACTIVE,
    QUEUED_WITH_DEADLINE,
    Job,
    JobAttempt,
    JobUsage,
    OutboxMessage,
    Output,
)
from .tenants import ApiKey, ConsoleSession, LaneClock, Tenant, TenantService
from .webhooks import (
    JobWebhook,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEvent,
    WebhookSecret,
)

__all__ = [
    "INTERACTIVE_JOB", "OUTPUTS_KEPT", "QUEUED", "QUEUED_BULK", "QUEUED_INTERACTIVE",
    "QUEUED_WITH_DEADLINE", "ApiKey", "Base", "Batch", "BatchRejection", "ConsoleSession",
    "File", "Job", "JobAttempt", "JobUsage", "JobWebhook", "LaneClock", "OutboxMessage",
    "Output", "Tenant", "TenantService", "UTCDateTime", "WebhookAttempt", "WebhookDelivery",
    "WebhookEndpoint", "WebhookEvent", "WebhookSecret", "Worker",
]
