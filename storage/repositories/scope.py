"""Whose rows a read may see: one tenant's, or (``None``) every tenant's. Only the
console of an operator's key asks for every tenant; the API's routes always pass the
tenant their key belongs to."""

from __future__ import annotations

from sqlalchemy import true


def tenant_is(column, tenant_id: str | None):
    """``column = tenant_id``, or no condition for ``None`` (every tenant)."""
    return true() if tenant_id is None else column == tenant_id
