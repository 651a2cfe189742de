"""The figures of the Overview, Workers and Usage pages, in one place: what the pages
show is read here and nowhere else, so another source (a worker registry, usage
records) replaces one function, not a page.

Today they are counted from the jobs the database holds (storage/repositories/
activity.py): the queue per pipeline and lane, the last hour's outcomes by reason, and
per tenant and day the jobs finished and the media their outputs hold. What this
deployment does not record is said so on the page, never made up: ``workers`` is None
where the API runs without the worker registry (storage/repositories/workers.py) or
cannot read it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime

from storage.records import WorkerRecord
from storage.repositories.activity import OutcomeRow, QueueRow, UsageRow

from ..deps import Services

log = logging.getLogger(__name__)

HOUR_S = 3600.0
BUCKET_S = 600.0  # the outcome charts' bars: six of ten minutes


@dataclass(frozen=True)
class Overview:
    queues: list[QueueRow]
    outcomes: list[OutcomeRow]
    workers: list[WorkerRecord] | None  # None: no worker registry to read
    now: datetime
    bucket_s: float = BUCKET_S

    def serving(self, pipeline: str) -> int | None:
        """Live workers taking the pipeline's jobs (draining ones do not)."""
        if self.workers is None:
            return None
        return sum(w.serves(pipeline) for w in self.workers)


def overview(svc: Services, scope: str | None) -> Overview:
    return Overview(queues=svc.activity.queues(scope),
                    outcomes=svc.activity.outcomes(scope, HOUR_S, BUCKET_S),
                    workers=workers(svc), now=datetime.now(UTC))


def workers(svc: Services) -> list[WorkerRecord] | None:
    """The live processes of the fleet (host, pipelines, device, current job, last
    heartbeat), read from the registry on each page draw: a handful of rows. None when
    the registry cannot be read, so the page says so rather than showing an empty fleet."""
    if svc.fleet is None:
        return None
    try:
        return svc.fleet.workers.live()
    except Exception:
        log.warning("worker registry unreadable", exc_info=True)
        return None


def usage(svc: Services, scope: str | None, days: int) -> list[UsageRow]:
    return svc.activity.usage(scope, days)
