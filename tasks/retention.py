"""Retention and orphans: what the store keeps, and for how long.

- Outputs expire ``OMNIJOBS_OUTPUT_TTL_S`` after completion: their objects are deleted,
  the job keeps its record (its outputs shown as expired).
- Finished jobs are deleted ``OMNIJOBS_JOB_TTL_S`` after they ended, objects first.
- Files (batch inputs and results) expire at their ``expires_at``: their objects are
  deleted, the record stays (``expired``).
- Orphans: an object under ``<tenant>/<job>/`` whose job no longer exists, or which
  its (finished) job does not list, is deleted, whatever the order in which a delete, a
  cancel and a worker's last upload happened; so is one that a superseded attempt wrote
  (``<tenant>/<job>/a<n>/...`` with n below the attempt that may still write).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Iterator
from itertools import islice

from celery import Celery

from storage.records import JobObjects, JobRecord

from .runtime import WorkerRuntime

log = logging.getLogger(__name__)

# <tenant>/<job>/[a<attempt>/]<name>: keys name their attempt; older ones did not
JOB_KEY = re.compile(r"^[^/]+/((?:job|video)_[0-9a-f]{32})/(?:a([0-9]{1,9})/)?[^/]+$")
BATCH = 500
MAX_BATCHES = 20  # per run, so one step never holds its thread for long


def job_prefix(job: JobRecord) -> str:
    return f"{job.tenant_id}/{job.id}/"


def delete_job_objects(rt: WorkerRuntime, job: JobRecord) -> None:
    """The job's outputs and anything else under its prefix (a leftover of a retry)."""
    keys = {o.key for o in job.outputs} | set(rt.store.list_keys(job_prefix(job)))
    rt.store.delete(sorted(keys))


def _in_batches(fetch: Callable[[int], list[JobRecord]],
                handle: Callable[[JobRecord], bool]) -> int:
    done = 0
    for _ in range(MAX_BATCHES):
        jobs = fetch(BATCH)
        done += sum(handle(job) for job in jobs)
        if len(jobs) < BATCH:
            break
    return done


def expire_outputs(rt: WorkerRuntime) -> int:
    def expire(job: JobRecord) -> bool:
        delete_job_objects(rt, job)
        return rt.jobs.mark_outputs_deleted(job.id)

    return _in_batches(lambda n: rt.jobs.outputs_to_expire(limit=n), expire)


def expire_jobs(rt: WorkerRuntime) -> int:
    def forget(job: JobRecord) -> bool:
        delete_job_objects(rt, job)
        return rt.jobs.delete_finished(job.id)

    return _in_batches(lambda n: rt.jobs.finished_before(rt.settings.job_ttl_s, limit=n),
                       forget)


def expire_files(rt: WorkerRuntime) -> int:
    """Delete the bytes of files past their expiry (object first, then the mark, so a
    crash in between only repeats the delete)."""
    done = 0
    for _ in range(MAX_BATCHES):
        files = rt.files.to_expire(limit=BATCH)
        for record in files:
            rt.store.delete([record.key])
            done += rt.files.mark_expired(record.id)
        if len(files) < BATCH:
            break
    return done


def apply_retention(rt: WorkerRuntime, _app: Celery) -> int:
    return expire_outputs(rt) + expire_jobs(rt) + expire_files(rt)


def _job_keys(keys: Iterable[str]) -> Iterator[tuple[str, int | None, str]]:
    """(job id, attempt or None for a key that names none, key) of each job's object."""
    for key in keys:
        if match := JOB_KEY.match(key):
            attempt = match.group(2)
            yield match.group(1), int(attempt) if attempt else None, key


def _orphaned(objects: JobObjects | None, attempt: int | None, key: str) -> bool:
    if objects is None:  # the job no longer exists
        return True
    if objects.keys is not None:  # finished: only what it lists
        return key not in objects.keys
    return attempt is not None and attempt < objects.first_live_attempt


def orphans_among(rt: WorkerRuntime, found: list[tuple[str, int | None, str]]) -> list[str]:
    owned = rt.jobs.live_keys(sorted({job for job, _, _ in found}))
    return [key for job, attempt, key in found if _orphaned(owned.get(job), attempt, key)]


def sweep_orphans(rt: WorkerRuntime, _app: Celery) -> int:
    """Delete objects no job owns. Keys that don't look like ``<tenant>/<job id>/<name>``
    (or ``<tenant>/<job id>/a<attempt>/<name>``) are never touched."""
    removed = 0
    pairs = _job_keys(rt.store.list_keys())
    while chunk := list(islice(pairs, BATCH)):
        orphans = orphans_among(rt, chunk)
        if orphans:
            rt.store.delete(orphans)
            log.warning("deleted %d orphaned objects", len(orphans))
            removed += len(orphans)
    return removed
