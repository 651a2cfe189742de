"""What the usage record adds to a job's completing transaction: per job, the complete
transaction (outputs + compare-and-set + event + attempt's end + the usage record) beside
the usage record's part alone (``storage.repositories.usage.settle`` in a transaction of
its own), on PostgreSQL, side by side in one run. The ratio is the figure.

    python -m bench.usage_record --jobs 300
"""

from __future__ import annotations

import argparse
import time
import uuid
from contextlib import ExitStack
from datetime import UTC, datetime

from core.jobs import JobKind
from storage.db import make_engine, make_sessionmaker
from storage.migrate import upgrade
from storage.records import NewJob, OutputRecord
from storage.repositories import JobRepository, KeyRepository
from storage.repositories.usage import settle

from .services import database


def run(jobs: int) -> dict[str, float]:
    with ExitStack() as stack:
        url = database(stack)
        upgrade(url)
        engine = make_engine(url)
        sessions = make_sessionmaker(engine)
        repo = JobRepository(sessions)
        tenant = KeyRepository(sessions).create_key("bench-" + uuid.uuid4().hex[:6])[0]
        out = [OutputRecord(index=0, key="k/0.wav", content_type="audio/wav", bytes=1000,
                            sha256="0" * 64, duration_s=1.0, sample_rate=22050, channels=1)]
        ids = []
        for _ in range(jobs):
            job, _ = repo.create(NewJob(tenant_id=tenant, kind=JobKind.SPEECH, model="piper-joe",
                                        pipeline="piper-joe", queue="q",
                                        request={"input": "hello"}, metadata=None,
                                        max_attempts=3))
            repo.claim(job.id, "bench", 60)
            ids.append(job.id)
        complete_s = settle_s = 0.0
        for job_id in ids:  # interleaved: each pair meets the same machine state
            t0 = time.perf_counter()
            repo.complete(job_id, 1, out, 3600, render=(0.5, "cpu"))
            t1 = time.perf_counter()
            with sessions.begin() as s:
                settle(s, job_id, datetime.now(UTC))
            t2 = time.perf_counter()
            complete_s, settle_s = complete_s + t1 - t0, settle_s + t2 - t1
        engine.dispose()
    return {"complete_ms": 1000 * complete_s / jobs, "settle_ms": 1000 * settle_s / jobs,
            "ratio": settle_s / complete_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=300)
    r = run(parser.parse_args().jobs)
    print(f"complete_ms_per_job={r['complete_ms']:.2f} usage_record_ms_per_job="
          f"{r['settle_ms']:.2f} usage_share_of_complete={r['ratio']:.2f}")


if __name__ == "__main__":
    main()
