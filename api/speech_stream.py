"""Streamed speech: ``stream_format`` ``audio`` (encoded bytes, chunked) or ``sse``
(OpenAI's ``speech.audio.delta`` / ``speech.audio.done`` events).

The job stays a job: the worker still validates, encodes, verifies and stores the whole
output, and records the job. Meanwhile it sends the raw samples each chunk adds
(``AudioAggregator.add``'s return value, so cumulative snapshots never repeat or
truncate) to the bus, and this module encodes them for the client as they arrive: the
worker stays format-agnostic and one chunk stream serves any number of formats.

The response starts with the first audio, so a job that fails before any audio is an
ordinary error answer. One that fails later (final validation: silent audio, say) ends
an SSE stream with an ``error`` event and cuts an audio stream short, so a client never
takes a truncated file for a whole one. A job restarted mid-stream (a retry) cannot be
spliced into what was already sent: the stream ends the same way and the job's result
is fetched with ``GET /v1/jobs/{id}/content``. Should the job complete before the first
chunk was read (an idempotent replay, say), its stored output is sent whole. A stream
that carried less audio than the job stored (the worker's bus writes failed) never ends
normally: it ends the same way, naming the content route, since a client would take a
short file for the whole one.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator

import anyio
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

from core.errors import Conflict, InvalidRequest, RenderFailed, ResultUnavailable
from core.jobs import JobStatus
from storage.records import JobRecord
from storage.views import speech_usage

from .deps import Services
from .live import SSE_HEADERS, Slot, Watch, error_json
from .metrics import LIVE_ACTIVE
from .service import deadline_ended

log = logging.getLogger(__name__)

# How much longer than the streamed samples a stored file may decode (encoder priming and
# padding: up to 2048 samples at the stored rate, plus a little): the tolerance of the
# worker's own check of the encoded bytes against the samples it encoded.
PADDING_SAMPLES, SLACK_S = 2048, 0.05


class StreamBroken(Exception):
    """The stream cannot go on truthfully; the job itself carries on or is recorded."""


def check_streamable(svc: Services, response_format: str) -> None:
    if svc.stream_encoder is None or response_format not in svc.streamable:
        formats = ", ".join(sorted(svc.streamable)) or "none"
        raise InvalidRequest(f"response_format '{response_format}' cannot be streamed "
                             f"(streamable: {formats})", param="response_format",
                             code="unsupported_stream_format")


class SpeechStream:
    """Reads a job's chunks and state and yields encoded pieces as they come."""

    def __init__(self, svc: Services, job: JobRecord, fmt: str) -> None:
        self.svc, self.job, self.fmt = svc, job, fmt
        self.cursor = ""
        self.attempt: int | None = None
        self.encoder = None
        self.content_type: str | None = None
        self.frames, self.rate = 0, 0  # what the stream carried
        self.done = False
        self.finished: JobRecord | None = None  # the completed job, once the stream ends
        self._ready: list[bytes] = []

    async def pieces(self, watch: Watch) -> AsyncIterator[bytes]:
        """Encoded bytes until the job ends; raises StreamBroken if it cannot finish."""
        deadline = time.monotonic() + self.svc.settings.event_stream_max_s
        first = True
        while True:
            # Notices of audio, claim and progress say the job runs on: no database read.
            # Any other may be the end. State first, then chunks: those read after it
            # are complete.
            await self._send(watch.job.id)
            if first or watch.sub.changed:
                job = await watch.reload()
                await self._send(job.id)
                if job.status.terminal:
                    while self._ready:
                        yield self._ready.pop(0)
                    async for data in self._finish(job):
                        yield data
                    return
            first = False
            while self._ready:
                yield self._ready.pop(0)
            left = deadline - time.monotonic()
            if left <= 0:
                raise StreamBroken(f"the stream reached its time limit; job {watch.job.id} "
                                  "goes on")
            await watch.next(left)

    async def _send(self, job_id: str) -> bool:
        """Read the chunks past the cursor and queue their encoded bytes; any read?"""
        chunks = await run_in_threadpool(self.svc.live.bus.read_audio, job_id, self.cursor)
        for chunk in chunks:
            data = await self._encode(chunk)
            self.cursor = chunk.cursor
            if data:
                self._ready.append(data)
        return bool(chunks)

    async def _encode(self, chunk) -> bytes:
        if self.attempt is None:
            self.attempt = chunk.attempt
        elif chunk.attempt != self.attempt:
            raise StreamBroken(f"job {self.job.id} restarted (attempt {chunk.attempt})")
        if self.encoder is None:
            self.encoder = self.svc.stream_encoder(self.fmt, chunk.sample_rate,
                                                   chunk.samples.shape[0])
            self.content_type = self.encoder.content_type
        self.frames, self.rate = self.frames + chunk.samples.shape[1], chunk.sample_rate
        return await run_in_threadpool(self.encoder.add, chunk.samples)

    def missing_s(self, job: JobRecord) -> float:
        """Seconds of the stored output this stream did not carry (0 when complete)."""
        out = job.outputs[0] if job.outputs else None
        if out is None or out.duration_s is None or not self.rate:
            return 0.0
        missing = out.duration_s - self.frames / self.rate
        slack = PADDING_SAMPLES / (out.sample_rate or self.rate) + SLACK_S
        return missing if missing > slack else 0.0

    async def _finish(self, job: JobRecord) -> AsyncIterator[bytes]:
        self.done = True  # the job ended: nothing left to cancel
        self.finished = job
        if deadline_ended(job) is not None:
            raise StreamBroken(f"job {job.id} ended {job.status.value}: {job.error_code}")
        if job.status is JobStatus.FAILED:
            raise StreamBroken(f"job {job.id} failed: {job.error_message}")
        if job.status is JobStatus.CANCELLED:
            raise StreamBroken(f"job {job.id} was cancelled")
        if self.encoder is not None:
            if job.attempts != self.attempt:
                raise StreamBroken(f"job {job.id} completed in another attempt")
            if missing := self.missing_s(job):
                raise StreamBroken(f"job {job.id} completed, but {missing:.2f} s of its audio "
                                   "did not reach this stream; fetch it whole with "
                                   f"GET /v1/jobs/{job.id}/content")
            tail = await run_in_threadpool(self.encoder.close)
        else:  # nothing streamed: the stored output is the whole answer
            out = job.outputs[0]
            self.content_type = out.content_type
            try:
                tail = await run_in_threadpool(self.svc.store.get, out.key)
            except Exception as exc:
                raise StreamBroken(f"job {job.id} completed but its result cannot be read "
                                   "right now") from exc
        if tail:
            yield tail


def early_error(job: JobRecord) -> Exception:
    """The answer for a job that ended before any audio (as the synchronous route's)."""
    if (ended := deadline_ended(job)) is not None:
        return ended
    if job.status is JobStatus.FAILED:
        return RenderFailed(f"job {job.id} failed: {job.error_message}",
                            code=job.error_code or "job_failed")
    if job.status is JobStatus.CANCELLED:
        return Conflict(f"job {job.id} was cancelled", code="job_cancelled")
    return ResultUnavailable(f"job {job.id} could not be streamed; fetch it with "
                             f"GET /v1/jobs/{job.id}/content")


async def stream_speech(svc: Services, job: JobRecord, fmt: str, mode: str,
                        cancel_on_disconnect: bool, slot: Slot | None = None
                        ) -> StreamingResponse | JobRecord:
    """Wait for the first audio (or the end), then stream the rest. A job still going
    when the stream's time is up before any audio is handed back (the route answers 202
    with it, as a synchronous wait that ran out does). ``slot`` (the tenant's, from
    ``Live.slot``) is given back when the stream ends, however it ends."""
    live = svc.live
    stack = contextlib.ExitStack()
    if slot is not None:
        stack.callback(slot.release)
    sub = stack.enter_context(live.watcher.subscribe(job.id))
    stack.enter_context(LIVE_ACTIVE.labels("stream").track_inprogress())
    stream = SpeechStream(svc, job, fmt)
    try:
        await run_in_threadpool(live.bus.listen, job.id)
        pieces = stream.pieces(Watch(svc, job, sub))
        first = await anext(pieces, b"")
    except StreamBroken:
        stack.close()
        job = await Watch(svc, job, sub).reload()
        if not job.status.terminal:
            return job
        raise early_error(job) from None
    except BaseException:
        stack.close()
        raise
    body = (_audio if mode == "audio" else _sse)(stream, first, pieces)
    headers = {"X-Job-Id": job.id, "Cache-Control": "no-cache"}
    if mode == "sse":
        headers |= SSE_HEADERS
    return StreamingResponse(_guarded(svc, job, stream, body, stack, cancel_on_disconnect),
                             media_type="text/event-stream" if mode == "sse"
                             else stream.content_type, headers=headers)


async def _audio(stream: SpeechStream, first: bytes, pieces: AsyncIterator[bytes]
                 ) -> AsyncIterator[bytes]:
    if first:
        yield first
    async for data in pieces:
        yield data


def _delta(data: bytes) -> bytes:
    payload = {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}
    return f"data: {json.dumps(payload)}\n\n".encode()


async def _sse(stream: SpeechStream, first: bytes, pieces: AsyncIterator[bytes]
               ) -> AsyncIterator[bytes]:
    try:
        if first:
            yield _delta(first)
        async for data in pieces:
            yield _delta(data)
    except StreamBroken as exc:
        yield f"data: {error_json('stream_failed', str(exc))}\n\n".encode()
        return
    done = {"type": "speech.audio.done", "usage": speech_usage(stream.finished)}
    yield f"data: {json.dumps(done)}\n\n".encode()


async def _guarded(svc: Services, job: JobRecord, stream: SpeechStream,
                   body: AsyncIterator[bytes], stack: contextlib.ExitStack,
                   cancel_on_disconnect: bool) -> AsyncIterator[bytes]:
    """Ends the watch however the stream ends; a client gone before the end cancels the
    job only if it asked to (``cancel_on_disconnect``)."""
    gone = True  # until the body ends on its own: a client that left cancels the task
    try:
        async for data in body:
            yield data
        gone = False
    except StreamBroken as exc:  # an audio stream is cut short: no final chunk is sent
        gone = False
        log.info("speech stream of %s cut short: %s", job.id, exc, extra={"job_id": job.id})
        raise
    finally:
        stack.close()
        if gone and not stream.done and cancel_on_disconnect:
            with anyio.CancelScope(shield=True):
                await _cancel(svc, job)


async def _cancel(svc: Services, job: JobRecord) -> None:
    try:
        await run_in_threadpool(svc.jobs.cancel, job.id, job.tenant_id)
        svc.live.notify(job.id)
        log.info("job %s cancelled: its streaming client went away", job.id,
                 extra={"job_id": job.id})
    except Exception:
        log.warning("could not cancel job %s after its client left", job.id, exc_info=True,
                    extra={"job_id": job.id})
