"""Typed records the repositories hand out, so no ORM object or Session leaves storage/;
one module per concern. Everything is re-exported here: callers import
``storage.records``."""

from .batches import (
    BatchLine,
    BatchRecord,
    FileRecord,
    LineRejected,
    NewFile,
    RejectionRecord,
    RequestCounts,
)
from .fleet import (
    InFlightJob,
    LanePicture,
    LaneSignals,
    QueueSignals,
    QueueStanding,
    SlotCount,
    WorkerBeat,
    WorkerProcess,
    WorkerRecord,
)
from .jobs import (
    MAIN,
    OUTPUT_DESCRIPTION,
    PREVIEWS,
    Deadlines,
    JobAttemptRecord,
    JobFilter,
    JobObjects,
    JobRecord,
    JobWebhookRequest,
    NewJob,
    OutboxRecord,
    OutputRecord,
    UsageRecord,
)
from .tenants import KeyRecord, SessionRecord
from .webhooks import (
    AttemptRecord,
    DeliveryLogRecord,
    DeliveryWork,
    EndpointRecord,
    SecretRecord,
)

__all__ = [
    "MAIN", "OUTPUT_DESCRIPTION", "PREVIEWS",
    "AttemptRecord", "BatchLine", "BatchRecord", "Deadlines",
    "DeliveryLogRecord", "DeliveryWork", "EndpointRecord", "FileRecord", "JobAttemptRecord",
    "JobFilter", "JobObjects", "JobRecord", "JobWebhookRequest", "KeyRecord", "LanePicture",
    "LaneSignals", "LineRejected", "NewFile", "NewJob", "OutboxRecord", "OutputRecord",
    "QueueSignals", "QueueStanding", "RejectionRecord", "RequestCounts", "SecretRecord",
    "SessionRecord", "UsageRecord", "WorkerBeat", "WorkerProcess", "InFlightJob", "SlotCount",
    "WorkerRecord",
]
