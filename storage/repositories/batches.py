"""Batches: creation under the bulk quota, expansion into jobs (bulk inserts), cancel, the
lease of the one process that validates or finalizes a batch, and the terminal
transitions, each with its webhook event in the same transaction.

Every status change is a compare-and-set on the batch's status (and, for the work a
process does, its lease token): a second maintenance process, or one whose lease ran out
and was taken over, changes nothing. The API's side is here; the maintenance side is
``BatchWork`` (batch_work.py); what both read, batch_rows.py.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from core.batches import COMPLETION_WINDOWS, BatchStatus
from core.errors import BatchQuotaExceeded, ServiceUnavailable

from ..db import rolled_back
from ..models import Batch
from ..records import BatchRecord, RequestCounts
from .batch_rows import (
    ACTIVE,
    BATCH_ID,
    batch_cursor,
    batch_record,
    live_counts,
    new_batch_id,
    utcnow,
)
from .batch_work import BatchWork
from .job_ends import cancel_batch_jobs
from .scope import tenant_is
from .usage import batch_sums

CANCEL_TRIES = 3  # a cancel the database aborted in a deadlock runs again (``cancel``)


class BatchRepository(BatchWork):
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    # ---- the API's side ----------------------------------------------------------------

    def create(self, tenant_id: str, *, endpoint: str, input_file_id: str,
               completion_window: str, metadata: dict[str, str] | None,
               max_active: int, output_expires_after_s: int | None = None) -> BatchRecord:
        """A new ``validating`` batch, unless the tenant already has ``max_active``
        unfinished ones (the bulk quota, apart from the interactive ones)."""
        now = utcnow()
        with self._sessions.begin() as s:
            active = s.scalar(select(func.count()).select_from(
                select(Batch.id).where(Batch.tenant_id == tenant_id,
                                       Batch.status.in_([a.value for a in ACTIVE]))
                .limit(max_active).subquery()))
            if active >= max_active:
                raise BatchQuotaExceeded(f"at most {max_active} unfinished batches per "
                                         "tenant; wait for one to finish")
            batch = Batch(id=new_batch_id(), tenant_id=tenant_id, endpoint=endpoint,
                          input_file_id=input_file_id, completion_window=completion_window,
                          status=BatchStatus.VALIDATING.value, metadata_=metadata, total=0,
                          completed=0, failed=0, rejected=0, created_at=now,
                          expires_at=now + timedelta(seconds=COMPLETION_WINDOWS[
                              completion_window]),
                          output_expires_after_s=output_expires_after_s)
            s.add(batch)
            s.flush()
            return batch_record(batch, RequestCounts())

    def get(self, batch_id: str, tenant_id: str | None = None) -> BatchRecord | None:
        if not BATCH_ID.fullmatch(batch_id):
            return None
        with self._sessions() as s:
            q = select(Batch).where(Batch.id == batch_id)
            if tenant_id is not None:
                q = q.where(Batch.tenant_id == tenant_id)
            batch = s.scalar(q)
            if batch is None:
                return None
            return batch_record(batch, live_counts(s, [batch]).get(batch.id),
                           batch_sums(s, [batch.id]).get(batch.id))

    def list(self, tenant_id: str | None, *, after: str | None = None, limit: int = 20
             ) -> tuple[list[BatchRecord], bool]:
        """Newest first, cursor on (created_at, id); returns (page, has_more). ``None``:
        every tenant's (storage.repositories.scope)."""
        with self._sessions() as s:
            q = select(Batch).where(tenant_is(Batch.tenant_id, tenant_id))
            if after is not None:
                cursor = batch_cursor(s, tenant_id, after)
                q = q.where((Batch.created_at < cursor[0])
                            | ((Batch.created_at == cursor[0]) & (Batch.id < cursor[1])))
            rows = s.scalars(q.order_by(Batch.created_at.desc(), Batch.id.desc())
                             .limit(limit + 1)).all()
            counts = live_counts(s, list(rows[:limit]))
            sums = batch_sums(s, [b.id for b in rows[:limit]])
            return ([batch_record(b, counts.get(b.id), sums.get(b.id)) for b in rows[:limit]],
                    len(rows) > limit)

    def cancel(self, batch_id: str, tenant_id: str) -> BatchRecord | None:
        """validating|in_progress -> cancelling, and every queued or running job of the
        batch -> cancelled, in one transaction. Returns the batch as it stands after.

        The jobs' update can deadlock with a worker's claim, which takes two job rows of
        the lane (the one it claims and the message holder it hands the token to) in
        whichever order the fair share picks them, so no lock order can be shared. The
        database breaks the cycle by aborting one side; when that is this one, nothing
        was written and it runs again."""
        tries = CANCEL_TRIES
        while True:
            tries -= 1
            try:
                return self._cancel(batch_id, tenant_id)
            except ServiceUnavailable as exc:
                if tries == 0 or not rolled_back(exc):
                    raise

    def _cancel(self, batch_id: str, tenant_id: str) -> BatchRecord | None:
        now = utcnow()
        with self._sessions.begin() as s:
            moved = s.execute(update(Batch).where(
                Batch.id == batch_id, Batch.tenant_id == tenant_id,
                Batch.status.in_([BatchStatus.VALIDATING.value,
                                  BatchStatus.IN_PROGRESS.value])).values(
                status=BatchStatus.CANCELLING.value, cancelling_at=now, lease_token=None,
                lease_expires_at=None)).rowcount  # a validator's lease: its CAS fails now
            if moved:
                cancel_batch_jobs(s, batch_id, now)
        return self.get(batch_id, tenant_id)
