"""Moving batches along: the maintenance step that validates new batches, ends
the ones whose jobs are all finished (or whose window has passed, or that were
cancelled) and writes their output and error files.

A batch's progress never depends on an API request or on one process staying up: each
piece of work is taken under the batch's lease, and a lease left by a process that died
runs out and is taken again. Writing the files is idempotent (deterministic file ids and
keys), and the batch's terminal transition records them with its webhook event.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import logging
import tempfile
from collections.abc import Iterator
from typing import IO, Any

from celery import Celery

from core.batches import BatchStatus, ending
from core.jobs import JobStatus
from storage.records import BatchRecord, JobRecord, NewFile, RejectionRecord
from storage.repositories.files import file_key
from storage.views import resource_view

from .batch_validate import LEASE_S, validate_batch
from .runtime import WorkerRuntime

log = logging.getLogger(__name__)

SPOOL_BYTES = 8 << 20  # output lines beyond this go to a temporary file, not memory
CANCELLED_REASON = {
    BatchStatus.EXPIRED: ("batch_expired", "the request did not finish within the batch's "
                          "completion window"),
    BatchStatus.CANCELLED: ("batch_cancelled", "the batch was cancelled"),
}

__all__ = ["advance_batches", "finalize_batch"]


def advance_batches(rt: WorkerRuntime, app: Celery) -> int:
    """One pass over the batches that need work; returns how many moved."""
    moved = 0
    for batch_id, status in rt.batches.due():
        try:
            if status is BatchStatus.VALIDATING:
                moved += validate_batch(rt, app, batch_id)
            else:
                moved += finalize_batch(rt, batch_id, status)
        except Exception:  # one bad batch must not stall the others; its lease runs out
            log.exception("batch %s: step failed; retried once its lease runs out", batch_id)
    return moved


def finalize_batch(rt: WorkerRuntime, batch_id: str, status: BatchStatus) -> int:
    """Write the output and error files and end the batch (completed, expired or
    cancelled). Returns 1 if it ended here."""
    if status is BatchStatus.IN_PROGRESS:
        token = rt.batches.begin_finalize(batch_id, LEASE_S)
    else:
        token = rt.batches.take(batch_id, status, LEASE_S)
    batch = rt.batches.get(batch_id) if token else None
    if batch is None:
        return 0
    output, error = write_results(rt, batch)
    ended = rt.batches.finish(batch_id, token, output, error)
    if ended is not None:
        log.info("batch %s %s: %d completed, %d failed", batch_id, ended.status.value,
                 ended.counts.completed, ended.counts.failed)
    return int(ended is not None)


def write_results(rt: WorkerRuntime, batch: BatchRecord) -> tuple[NewFile | None, NewFile | None]:
    """Every request's line, in input order, into the output file (completed jobs) or
    the error file (the rest); each file stored only if it has lines."""
    final = ending(batch.status, batch.expired_at is not None)
    with _spool() as ok, _spool() as bad:
        for is_error, line in _result_lines(rt, batch, final):
            (bad if is_error else ok).write(json.dumps(line, separators=(",", ":")).encode()
                                            + b"\n")
        return _store(rt, batch, "output", ok), _store(rt, batch, "error", bad)


def _spool() -> tempfile.SpooledTemporaryFile:
    return tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)


def _store(rt: WorkerRuntime, batch: BatchRecord, kind: str, spool: IO[bytes]
           ) -> NewFile | None:
    size = spool.tell()
    if not size:
        return None
    file_id = "file-" + hashlib.sha256(f"{batch.id}/{kind}".encode()).hexdigest()[:32]
    key = file_key(batch.tenant_id, file_id)
    spool.seek(0)
    rt.store.put_file(key, spool, "application/jsonl")
    return NewFile(id=file_id, tenant_id=batch.tenant_id, purpose="batch_output",
                   filename=f"{batch.id}_{kind}.jsonl", bytes=size, key=key,
                   expires_after_s=batch.output_expires_after_s or rt.settings.file_ttl_s)


def _result_lines(rt: WorkerRuntime, batch: BatchRecord, final: BatchStatus
                  ) -> Iterator[tuple[bool, dict[str, Any]]]:
    """(goes to the error file, line) per request: jobs and refused lines merged back
    into input order."""
    jobs = ((index, _job_line(rt, custom_id, job, final))
            for index, custom_id, job in rt.batches.results(batch.id))
    refused = ((r.line, _refused_line(batch.id, r)) for r in rt.batches.rejections(batch.id))
    for _index, entry in heapq.merge(jobs, refused, key=lambda pair: pair[0]):
        yield entry


def _job_line(rt: WorkerRuntime, custom_id: str, job: JobRecord, final: BatchStatus
              ) -> tuple[bool, dict[str, Any]]:
    body = resource_view(job, rt.store, rt.settings.signed_url_ttl_s).model_dump(mode="json")
    error = None
    if job.status is JobStatus.FAILED:
        error = {"code": job.error_code or "job_failed", "message": job.error_message or ""}
    elif job.status is JobStatus.EXPIRED:  # the batch's window passed before it was done
        code, message = CANCELLED_REASON[BatchStatus.EXPIRED]
        error = {"code": code, "message": message}
    elif job.status is JobStatus.CANCELLED:
        code, message = CANCELLED_REASON.get(final, ("job_cancelled", "the job was cancelled"))
        error = {"code": code, "message": message}
    elif job.status is not JobStatus.COMPLETED:
        error = {"code": "job_unfinished", "message": f"the job is {job.status.value}"}
    return error is not None, {
        "id": "batch_req_" + job.id.split("_", 1)[1], "custom_id": custom_id,
        "response": {"status_code": 200, "request_id": job.id, "body": body}, "error": error}


def _refused_line(batch_id: str, refused: RejectionRecord) -> tuple[bool, dict[str, Any]]:
    request_id = hashlib.sha256(f"{batch_id}/{refused.line}".encode()).hexdigest()[:32]
    return True, {"id": "batch_req_" + request_id, "custom_id": refused.custom_id,
                  "response": {"status_code": refused.status_code, "request_id": None,
                               "body": refused.body}, "error": None}

