"""A tenant's credentials as the operator and the console see them: API keys (never the
key itself) and console sessions."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class KeyRecord:
    """An API key as an operator sees it: never the key itself."""

    prefix: str
    tenant: str
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None


@dataclass(frozen=True)
class SessionRecord:
    """A signed-in console session: whose key, which tenant, and its CSRF token."""

    tenant_id: str
    tenant_name: str
    operator: bool
    key_prefix: str
    csrf: str
