"""Event streams and waits are bounded: a tenant may hold only so many open at once on an
API process (429 with Retry-After, nothing submitted), and however many are open, the
database resync of the jobs they watch is one query per interval for the whole process,
not one per stream. Nothing renders here, so every job stays queued."""

from __future__ import annotations

import asyncio
import uuid

import httpx
from prometheus_client import REGISTRY
from sqlalchemy import event

from ..integration.helpers import assert_openai_error
from .conftest import new_key

ASYNC = {"Prefer": "respond-async"}
DEADLINE_S = 30.0


def client_for(api, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=api.app),
                             base_url="http://api", timeout=DEADLINE_S,
                             headers={"Authorization": f"Bearer {key}"})


async def queued(client: httpx.AsyncClient, n: int) -> list[str]:
    ids = []
    for i in range(n):
        resp = await client.post("/v1/audio/speech", headers=ASYNC,
                                 json={"model": "tts-1", "input": f"Waiting {i}."})
        assert resp.status_code == 202, resp.text
        ids.append(resp.json()["id"])
    return ids


def streams_open() -> float:
    return REGISTRY.get_sample_value("omnijobs_live_active", {"kind": "events"})


async def open_streams(before: float, n: int) -> None:
    """Until ``n`` more event streams are open than ``before``."""
    deadline = asyncio.get_running_loop().time() + DEADLINE_S
    while streams_open() < before + n:
        assert asyncio.get_running_loop().time() < deadline, "the streams never opened"
        await asyncio.sleep(0.02)


def test_n_streams_cost_one_query_per_interval(make_api, api_db):
    """Ten idle streams over more than ten resync intervals: every periodic read of the
    jobs table names all ten jobs (one query serves every stream), and each stream reads
    its job on its own only when it starts."""
    api = make_api(event_resync_s=0.1, event_stream_max_s=1.5, event_heartbeat_s=10)
    key = new_key(api_db, "resync-" + uuid.uuid4().hex[:8])
    reads: list[str] = []
    resyncs: list[str] = []  # JobRepository.states: the one read that serves every stream

    standing: list[str] = []  # the queue events' reads of where a queued job stands

    def count(_conn, _cursor, statement, parameters, _context, _many) -> None:
        if ("count(" in statement or "job_attempts" in statement or "tenants" in statement
                or "row_number" in statement):
            standing.append(str(parameters))
        elif statement.startswith("SELECT jobs.id, jobs.status, jobs.attempts, jobs.progress "
                                  "\nFROM jobs"):
            resyncs.append(str(parameters))
        elif "FROM jobs" in statement:
            reads.append(str(parameters))

    async def run() -> list[str]:
        async with client_for(api, key) as client:
            ids = await queued(client, 10)
            event.listen(api.app.state.engine, "before_cursor_execute", count)
            try:
                answers = await asyncio.gather(*(client.get(f"/v1/jobs/{i}/events")
                                                 for i in ids))
            finally:
                event.remove(api.app.state.engine, "before_cursor_execute", count)
        assert all(a.status_code == 200 and "event: status" in a.text for a in answers)
        return ids

    ids = asyncio.run(run())
    named = [sum(i in r for i in ids) for r in resyncs + reads]
    assert 0 not in named  # every read of the jobs table was for these streams
    # The resync ran, over all ten jobs at once, in one query. (A tick while only some
    # streams were open, as they start or end on a loaded machine, names fewer: still
    # one query. How many ticks find all ten open depends on the machine's pace: 2 of 3
    # on a loaded one, so one is what is asked.)
    assert len(ids) in [sum(i in r for i in ids) for r in resyncs], resyncs
    # Apart from it, each stream read its job only as it started (the route's lookup and
    # the first read), however long it stayed open.
    assert all(sum(i in r for i in ids) == 1 for r in reads), reads
    assert all(sum(i in r for r in reads) <= 2 for i in ids), reads
    # A queued job's place (its ``queue`` events): its own index count as its stream
    # starts, then the lane's board (one query ranking every stream's job, at most once
    # per QUEUE_EVENT_S: here at most once more within the 1.5 s), beside one picture of
    # the lane per process that every stream shares.
    assert all(sum(i in r for r in standing) <= 2 for i in ids), standing
    boards = [r for r in standing if sum(i in r for i in ids) > 1]
    assert len(boards) <= 1, boards


def test_a_tenant_over_its_stream_cap_gets_429(make_api, api_db):
    """Two streams open with a cap of two: a third, and a synchronous speech request
    (which would wait), are refused with 429 before anything is submitted; another
    tenant is not held back, and the slots come back when the streams end."""
    api = make_api(tenant_max_streams=2, event_stream_max_s=3.0, event_heartbeat_s=10,
                   sync_wait_default_s=1.0)
    key = new_key(api_db, "capped-" + uuid.uuid4().hex[:8])
    other = new_key(api_db, "uncapped-" + uuid.uuid4().hex[:8])

    async def run() -> None:
        async with client_for(api, key) as client, client_for(api, other) as neighbour:
            ids = await queued(client, 2)
            jobs_before = len((await client.get("/v1/jobs", params={"limit": 100})
                               ).json()["data"])
            before = streams_open()
            held = [asyncio.ensure_future(client.get(f"/v1/jobs/{i}/events")) for i in ids]
            await open_streams(before, 2)
            refused = await client.get(f"/v1/jobs/{ids[0]}/events")
            assert_openai_error(refused, 429, "too_many_streams")
            assert int(refused.headers["retry-after"]) >= 1
            waited = await client.post("/v1/audio/speech",  # a wait: refused before submit
                                       json={"model": "tts-1", "input": "Wait for me."})
            assert_openai_error(waited, 429, "too_many_streams")
            after = (await client.get("/v1/jobs", params={"limit": 100})).json()["data"]
            assert len(after) == jobs_before  # nothing was submitted
            [mine] = await queued(neighbour, 1)  # another tenant is not held back
            ok = await neighbour.get(f"/v1/jobs/{mine}/events")
            assert ok.status_code == 200
            for answer in await asyncio.gather(*held):
                assert answer.status_code == 200
            again = await client.get(f"/v1/jobs/{ids[0]}/events")  # slots given back
            assert again.status_code == 200

    asyncio.run(run())
