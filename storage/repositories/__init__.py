"""Repositories own every SQL statement; callers get records, never sessions."""

from .jobs import JobRepository
from .keys import KeyRepository
from .outbox import OutboxRepository
from .webhooks import WebhookRepository

__all__ = ["JobRepository", "KeyRepository", "OutboxRepository", "WebhookRepository"]
