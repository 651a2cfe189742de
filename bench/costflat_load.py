"""The rows the cost-flat benchmark reads, written with set-based SQL (``INSERT ...
SELECT ... generate_series``), so a million jobs load in minutes, not hours.

Two parts. The *working set* goes into both databases: what the measured reads find
(a tenant's recent pages, queued jobs to claim, a few stale, reapable and expirable
jobs). The *history* goes into the loaded database only: what a month of use leaves
behind once retention keeps it at ``OMNIJOBS_JOB_TTL_S`` (30 days): finished jobs with
their outputs, attempts, outbox rows, webhook events and deliveries, spread over 1,000
tenants (a tenth of them for the benchmark's own tenant), plus a backlog of queued ones.
Everything is relative to ``now()`` at load time, as the defaults of the settings see it
(outputs deleted 7 days after completion, records after 30).
"""

from __future__ import annotations

import psycopg

TENANTS = 1000
PAGE_JOBS = 10_100  # the benchmark tenant's recent jobs: 101 pages of 100
CLAIMABLE = 1_000  # queued working-set jobs, one per claim sample at most
FEW = 30  # stale queued, expired leases, due expirations, records due for deletion
HISTORY = 1_000_000
QUEUED = 100_000

REQUEST = ("json_build_object('model', 'tts-1', 'voice', 'alloy', 'response_format', 'wav',"
           " 'input', 'A sentence of about this length to speak, number ' || i)")


def _jobs(prefix: str, n: str, tenant: str, created: str, status: str, **cols: str) -> str:
    """One ``INSERT INTO jobs ... SELECT ... FROM generate_series(1, n) i``; ``cols``
    overrides the columns that depend on the job's fate."""
    c = {"pipeline": "'piper-joe'", "started_at": "NULL", "completed_at": "NULL",
         "lease_expires_at": "NULL", "expires_at": "NULL", "outputs_deleted_at": "NULL",
         "attempts": "0", "updated_at": "created_at", "worker_id": "NULL",
         # the working set's rows say which part they are (the claims pick theirs)
         "metadata": "NULL" if prefix.startswith("h") else f"'{{\"set\": \"{prefix}\"}}'"}
    c.update(cols)
    return f"""
    INSERT INTO jobs (id, tenant_id, kind, model, pipeline, status, progress, request,
        metadata, attempts, max_attempts, created_at, updated_at, started_at, completed_at,
        lease_expires_at, expires_at, outputs_deleted_at, dispatch_token, worker_id)
    SELECT id, tenant_id, 'speech', 'tts-1', {c['pipeline']}, status,
        CASE WHEN status = 'completed' THEN 100 ELSE 0 END, request, {c['metadata']},
        {c['attempts']},
        3, created_at, {c['updated_at']}, {c['started_at']}, {c['completed_at']},
        {c['lease_expires_at']}, {c['expires_at']}, {c['outputs_deleted_at']},
        left(md5(id), 32), {c['worker_id']}
    FROM (SELECT i, 'job_' || md5('{prefix}' || i) AS id, {tenant} AS tenant_id,
                 {status} AS status, {created} AS created_at, {REQUEST} AS request
          FROM generate_series(1, {n}) i) s"""


def _finished(prefix: str, n: str, tenant: str, created: str, status: str,
              outputs_deleted: str) -> str:
    return _jobs(prefix, n, tenant, created, status, attempts="1", worker_id="'w-1'",
                 started_at="created_at + interval '1 second'",
                 completed_at="created_at + interval '5 seconds'",
                 updated_at="created_at + interval '5 seconds'",
                 expires_at="CASE WHEN status = 'completed' THEN created_at + "
                            "interval '7 days 5 seconds' END",
                 outputs_deleted_at=outputs_deleted)


def _children() -> list[str]:
    """Outputs, attempts, outbox rows, webhook events and deliveries of every job, as
    the worker and the relay would have left them."""
    return ["""
    INSERT INTO outputs (job_id, index, key, content_type, bytes, sha256, duration_s,
        sample_rate, channels, created_at)
    SELECT id, 0, 'jobs/' || id || '/1/0.wav', 'audio/wav', 88244, md5(id) || md5(id), 2.0,
        22050, 1, completed_at FROM jobs WHERE status = 'completed'""", """
    INSERT INTO job_attempts (job_id, attempt, worker_id, claimed_at, ended_at, outcome)
    SELECT id, 1, 'w-1', started_at, completed_at, status FROM jobs
    WHERE started_at IS NOT NULL""", """
    INSERT INTO outbox (topic, job_id, queue, payload, created_at, available_at,
        published_at)
    SELECT 'render', id, 'render.' || pipeline,
        json_build_object('job_id', id, 'token', dispatch_token), created_at, created_at,
        created_at + interval '10 milliseconds' FROM jobs""", """
    INSERT INTO webhook_events (id, tenant_id, job_id, type, created_at)
    SELECT 'evt_' || md5(id), tenant_id, id, 'speech.' || status, completed_at FROM jobs
    WHERE completed_at IS NOT NULL""", """
    INSERT INTO webhook_deliveries (event_id, url, target, status, attempts, created_at,
        updated_at)
    SELECT 'evt_' || md5(id), 'https://hooks.example.com/omnijobs', id, 'succeeded', 1,
        completed_at, completed_at + interval '1 second' FROM jobs
    WHERE completed_at IS NOT NULL"""]


def _tenant(i: str) -> str:
    return f"'ten_load' || lpad(({i})::text, 4, '0')"


def working_set(bench_tenant: str) -> list[str]:
    """What both databases hold: the reads' targets."""
    other = _tenant("1 + i % 999")
    bench = f"'{bench_tenant}'"
    return [
        # the benchmark tenant's recent jobs: 101 pages, a second apart, newest last
        _finished("wp", str(PAGE_JOBS), bench,
                  "now() - interval '3 hours' + i * interval '1 second'", "'completed'",
                  "NULL"),
        # queued jobs the claims take, their messages out (and in the broker)
        _jobs("wq", str(CLAIMABLE), other, "now() - interval '2 minutes'", "'queued'"),
        # queued in a lane of their own, their messages out: the fair claims' (they take
        # whichever job of the lane is fairest, so no other figure's rows are near)
        _jobs("wf", str(CLAIMABLE), other, "now() - interval '2 minutes'", "'queued'",
              pipeline="'audex-tts'"),
        # queued for two hours with a message sent then: the stale-queued sweep's finds
        _jobs("ws", str(FEW), other, "now() - interval '2 hours'", "'queued'"),
        # running, their worker gone: the lease reaper's
        _jobs("wr", str(FEW), other, "now() - interval '10 minutes'", "'running'",
              attempts="1", worker_id="'w-dead'", started_at="created_at",
              lease_expires_at="now() - interval '1 minute'"),
        # completed 7 days ago, objects not deleted yet: retention's outputs_to_expire
        _finished("we", str(FEW), other, "now() - interval '7 days 1 minute'",
                  "'completed'", "NULL"),
        # ended 30 days ago: retention's finished_before (records to delete)
        _finished("wd", str(FEW), other, "now() - interval '30 days 1 hour'",
                  "'failed'", "NULL"),
    ]


def history(scale: float, bench_tenant: str) -> list[str]:
    """The loaded database's month of use (``scale`` times a million finished jobs and a
    hundred thousand queued)."""
    n, q = max(1, round(HISTORY * scale)), max(1, round(QUEUED * scale))
    tenant = (f"CASE WHEN i % 10 = 0 THEN '{bench_tenant}' "
              f"ELSE {_tenant('1 + i % 999')} END")
    status = ("CASE WHEN i % 100 < 90 THEN 'completed' WHEN i % 100 < 97 THEN 'failed' "
              "ELSE 'cancelled' END")
    # older than the working set's pages; 29 days spread, in no particular order
    spread = (f"now() - interval '4 hours' - ((i::bigint * 7919) % {n})::float / {n}"
              " * interval '29 days'")
    # none completed within three hours of its outputs' expiry: for the hours a run
    # takes, retention's due rows are the working set's alone, in both databases
    created = (f"CASE WHEN {spread} > now() - interval '7 days 10 minutes' AND {spread} < "
               f"now() - interval '7 days' + interval '3 hours' THEN {spread} - "
               f"interval '4 hours' ELSE {spread} END")
    deleted = ("CASE WHEN status = 'completed' AND created_at < now() - interval '7 days "
               "10 minutes' THEN created_at + interval '7 days 10 minutes' END")
    pipeline = ("CASE WHEN i % 4 < 2 THEN 'piper-joe' WHEN i % 4 = 2 THEN 'minimax-h3' "
                "ELSE 'audex-tts' END")
    return [_finished("h", str(n), tenant, created, status, deleted),
            # a backlog of the last ten minutes, none of it the benchmark tenant's
            _jobs("hq", str(q), _tenant("1 + i % 999"),
                  "now() - (i % 600) * interval '1 second'", "'queued'",
                  pipeline=pipeline.replace("i % 4", "(i / 7) % 4"))]


def load(url: str, bench_tenant: str, scale: float | None, idle_tenants: int = 0) -> None:
    """The tenants and the working set, and with ``scale`` the history too; then
    ``VACUUM ANALYZE``, as autovacuum would have left a month-old database.
    ``idle_tenants``: that many more tenants that have never submitted anything (the
    sign-ups a year leaves), with the history only."""
    tenants = f"""
    INSERT INTO tenants (id, name, created_at)
    SELECT 'ten_load' || lpad(i::text, 4, '0'), 'load-' || i, now() - interval '60 days'
    FROM generate_series(1, {TENANTS - 1}) i"""
    steps = [tenants, *working_set(bench_tenant)]
    if scale is not None:
        steps += history(scale, bench_tenant)
    if scale is not None and idle_tenants:
        steps.append(f"""
    INSERT INTO tenants (id, name, created_at)
    SELECT 'ten_idle' || i, 'idle-' || i, now() - interval '200 days'
    FROM generate_series(1, {int(idle_tenants)}) i""")
    with psycopg.connect(url.replace("+psycopg", ""), autocommit=True) as conn:
        conn.execute("SET maintenance_work_mem = '256MB'")
        for sql in [*steps, *_children()]:
            conn.execute(sql)
        conn.execute("VACUUM ANALYZE")
