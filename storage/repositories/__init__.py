"""Repositories own every SQL statement; callers get records, never sessions."""

from .jobs import JobRepository
from .keys import KeyRepository
from .outbox import OutboxRepository

__all__ = ["JobRepository", "KeyRepository", "OutboxRepository"]
