"""Repositories own every SQL statement; callers get records, never sessions."""

from .batches import BatchRepository
from .files import FileRepository
from .jobs import JobRepository
from .keys import KeyRepository
from .outbox import OutboxRepository
from .queues import QueueRepository
from .webhooks import WebhookRepository
from .workers import WorkerRepository

__all__ = ["BatchRepository", "FileRepository", "JobRepository", "KeyRepository",
           "OutboxRepository", "QueueRepository", "WebhookRepository", "WorkerRepository"]
