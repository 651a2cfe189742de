"""Group commit of submits, on the event loop's side.

A submit without an idempotency key joins the group that is waiting to be written; a
writer thread inserts a whole group's jobs and render messages in one transaction
(``JobRepository.create_many``), and the group's callers are answered as soon as it is
committed: a 202 means the job and its message are committed. The commit, the round trips
and the thread hand-offs are shared by every submit that arrived while the previous group
was being written. Under no load a group is one submit and nothing waits for company: a
group leaves as soon as a writer is free.

Publishing is off the request path: one background thread publishes what the groups
committed (everything waiting, in one broker round trip) and then marks it published. A
broker that is down or frozen (every broker call is bounded by OMNIJOBS_REDIS_TIMEOUT_S)
therefore delays no answer; what it did not take stays in the outbox and the relay
publishes it. A message published twice (the process died before marking it) is
harmless: a render message claims its job by compare-and-set on the dispatch token.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor

from storage.records import JobRecord, NewJob, OutboxRecord

from .metrics import JOBS_SUBMITTED, PUBLISH_DEFERRED

log = logging.getLogger(__name__)

WRITERS = 1  # one group in flight; the next one forms while it is written
MAX_GROUP = 256
# Published messages are marked at most this long after they went out, all of them in one
# UPDATE: under a trickle of submits that is one marking transaction per quarter second
# instead of one per submit (each an UPDATE, a commit and its flush), taken off the moment
# the job is being claimed. Far inside the relay's grace (OMNIJOBS_OUTBOX_GRACE_S), and a
# message re-sent anyway is harmless (dispatch tokens).
MARK_DELAY_S = 0.25


class Submitter:
    THREADS = WRITERS + 1  # the writers and the publisher: each may hold a connection

    def __init__(self, writers: int = WRITERS, max_group: int = MAX_GROUP) -> None:
        self._writers, self._max_group = writers, max_group
        self._pool = ThreadPoolExecutor(writers, thread_name_prefix="submit")
        self._publisher = ThreadPoolExecutor(1, thread_name_prefix="outbox-publish")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: list[tuple[NewJob, asyncio.Future]] = []
        self._in_flight = 0
        self._tasks: set[asyncio.Task] = set()
        self._lock = threading.Lock()
        self._to_publish: list[OutboxRecord] = []
        self._publishing = False
        self._to_mark: list[int] = []
        self._marking: threading.Timer | None = None

    async def submit(self, svc, new: NewJob) -> JobRecord:
        """The committed job, or the refusal (quotas) or outage (503) that stopped it."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a new event loop (a test client's): start afresh
            self._loop, self._waiting, self._in_flight = loop, [], 0
        future = loop.create_future()
        self._waiting.append((new, future))
        self._start_groups(svc)
        return await future

    def flush(self) -> None:
        """Wait for the background publishing and marking (shutdown)."""
        self._publisher.submit(lambda: None).result()
        with self._lock:
            timer, self._marking = self._marking, None
        if timer is not None:
            timer.cancel()
            self._publisher.submit(*timer.args).result()

    def _start_groups(self, svc) -> None:
        while self._waiting and self._in_flight < self._writers:
            group = self._waiting[:self._max_group]
            del self._waiting[:self._max_group]
            self._in_flight += 1
            task = self._loop.create_task(self._write(svc, group))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _write(self, svc, group: list[tuple[NewJob, asyncio.Future]]) -> None:
        loop = asyncio.get_running_loop()
        try:
            results = await loop.run_in_executor(self._pool, self._commit, svc,
                                                 [new for new, _ in group])
        except Exception as exc:  # the whole group failed (e.g. the database is down)
            results = [exc] * len(group)
        finally:
            if loop is self._loop:
                self._in_flight -= 1
        for (_, future), result in zip(group, results, strict=True):
            if future.done():  # the caller went away; its job stands
                continue
            if isinstance(result, Exception):
                future.set_exception(result)
            else:
                future.set_result(result[0])
        if loop is self._loop:
            self._start_groups(svc)

    def _commit(self, svc, news: list[NewJob]) -> list:
        """In a writer thread: insert the group; its messages go to the publisher."""
        results = svc.jobs.create_many(news)
        committed = [r for r in results if not isinstance(r, Exception)]
        for job, _ in committed:
            JOBS_SUBMITTED.labels(job.kind.value, job.model).inc()
        self.publish_later(svc, [msg for _, msg in committed])
        return results

    def publish_later(self, svc, msgs: list[OutboxRecord]) -> None:
        """Hand committed messages to the background publisher (any thread)."""
        if not msgs:
            return
        with self._lock:
            self._to_publish.extend(msgs)
            start, self._publishing = not self._publishing, True
        if start:
            self._publisher.submit(self._publish_all, svc)

    def _publish_all(self, svc) -> None:
        while True:
            with self._lock:
                msgs, self._to_publish = self._to_publish, []
                if not msgs:
                    self._publishing = False
                    return
            try:
                publish_now(svc, msgs)
            except Exception:  # the relay publishes them later; the jobs are already safe
                PUBLISH_DEFERRED.inc(len(msgs))
                log.warning("publish failed for %d jobs; left to the outbox relay", len(msgs))
                continue
            self._mark_later(svc, [m.id for m in msgs])

    def _mark_later(self, svc, ids: list[int]) -> None:
        with self._lock:
            self._to_mark.extend(ids)
            if self._marking is not None:
                return
            self._marking = threading.Timer(MARK_DELAY_S, self._publisher.submit,
                                            [self._mark, svc])
            self._marking.daemon = True
            self._marking.start()

    def _mark(self, svc) -> None:
        """On the publisher's thread: mark everything published since the last time."""
        with self._lock:
            ids, self._to_mark, self._marking = self._to_mark, [], None
        if not ids:
            return
        try:
            svc.outbox.mark_published(ids)
        except Exception:  # the relay sends them again: harmless
            log.warning("could not mark %d messages published", len(ids), exc_info=True)


def publish_now(svc, msgs: list[OutboxRecord]) -> None:
    """One broker round trip for all of them where the app has one (``publish_many``)."""
    if svc.publish_many is not None:
        svc.publish_many(msgs)
    else:
        for msg in msgs:
            svc.publish(msg)
