"""The figures of the Overview, Workers and Usage pages, in one place: what the pages
show is read here and nowhere else, so another source (a worker registry, usage
records) replaces one function, not a page.

Today they are counted from the jobs the database holds (storage/repositories/
activity.py): the queue per pipeline and lane, the last hour's outcomes by reason, and
per tenant and day the jobs finished and the media their outputs hold. What this
deployment does not record is said so on the page, never made up: ``workers`` is None
while there is no worker registry to read.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from storage.repositories.activity import OutcomeRow, QueueRow, UsageRow

from ..deps import Services

HOUR_S = 3600.0
BUCKET_S = 600.0  # the outcome charts' bars: six of ten minutes


@dataclass(frozen=True)
class Overview:
    queues: list[QueueRow]
    outcomes: list[OutcomeRow]
    workers: list | None  # None: no worker registry in this deployment
    now: datetime
    bucket_s: float = BUCKET_S


def overview(svc: Services, scope: str | None) -> Overview:
    return Overview(queues=svc.activity.queues(scope),
                    outcomes=svc.activity.outcomes(scope, HOUR_S, BUCKET_S),
                    workers=workers(svc), now=datetime.now(UTC))


def workers(_svc: Services) -> list | None:
    """The live workers (host, pipelines, device, current job, last heartbeat), once a
    registry records them; None until then."""
    return None


def usage(svc: Services, scope: str | None, days: int) -> list[UsageRow]:
    return svc.activity.usage(scope, days)
