"""Tenants' shares of the lanes: the operator's weights (``omnijobs tenants weight``)."""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from core.errors import InvalidRequest, NotFound

from ..models import Tenant

MAX_WEIGHT = 1000.0


class ShareRepository:
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    def set_weight(self, tenant: str, weight: float) -> float:
        """Set a tenant's weight (by id or name); returns it. A weight of 3 gets three
        claims for each of a weight-1 tenant's while both wait in the same lane."""
        if not 0 < weight <= MAX_WEIGHT:
            raise InvalidRequest(f"a weight is a number above 0 and at most {MAX_WEIGHT:g}",
                                 param="weight", code="invalid_weight")
        with self._sessions.begin() as s:
            done = s.execute(update(Tenant).where(
                (Tenant.id == tenant) | (Tenant.name == tenant)).values(
                share_weight=weight)).rowcount
        if done != 1:
            raise NotFound(f"no tenant {tenant[:32]!r}")
        return weight

    def weights(self) -> dict[str, tuple[str, float]]:
        """Every tenant's (name, weight), by id."""
        with self._sessions() as s:
            return {r.id: (r.name, r.share_weight) for r in s.execute(
                select(Tenant.id, Tenant.name, Tenant.share_weight))}
