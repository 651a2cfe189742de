"""Fair share inside a lane, with real workers, PostgreSQL and Redis: a tenant with a few
jobs is not stuck behind another tenant's thousand, in the interactive lane and in the
bulk lane, and weights split the service."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from storage.db import make_sessionmaker
from storage.repositories.shares import ShareRepository

from ..services import wait_until
from .conftest import INSTANT, FairStack, submit_many, wait_done

BIG, SMALL = 1000, 10
WITHIN = 30


def tenant_id(st: FairStack, name: str) -> str:
    [(tid,)] = st.rows("SELECT id FROM tenants WHERE name = :n", n=name)
    return tid


def rank_of_last(finished: list[tuple[str, datetime]], tenant: str, count: int) -> int:
    """How many completions it took, from the start of ``finished``, until ``tenant``'s
    ``count`` jobs were all among them."""
    seen = 0
    for i, (who, _) in enumerate(finished, start=1):
        seen += who == tenant
        if seen == count:
            return i
    raise AssertionError(f"only {seen} of the tenant's {count} jobs completed")


def test_a_small_tenant_is_not_stuck_behind_a_big_one(fair: FairStack):
    a_key, b_key = fair.new_key("fair-a"), fair.new_key("fair-b")
    submit_many(fair, a_key, INSTANT, BIG, "a")
    queued_at = datetime.now(UTC)
    b_jobs = submit_many(fair, b_key, INSTANT, SMALL, "b")
    # Two workers start with a thousand of a's messages ahead of b's ten.
    fair.start_workers(INSTANT, "fair-0", "fair-1")
    wait_done(fair, b_jobs)
    rank = rank_of_last(fair.finished_since(INSTANT, queued_at), tenant_id(fair, "fair-b"),
                        SMALL)
    print(f"tenant_b_done_within_first={rank}")
    assert rank <= WITHIN  # first come, first served: 1,010


def upload_batch(client, lines: int, label: str) -> str:
    body = "".join(json.dumps({
        "custom_id": f"{label}-{i}", "method": "POST", "url": "/v1/audio/speech",
        "body": {"model": INSTANT, "input": f"{label} {i}", "response_format": "wav"}}) + "\n"
        for i in range(lines))
    file = client.post("/v1/files", data={"purpose": "batch"},
                       files={"file": (f"{label}.jsonl", body.encode())})
    assert file.status_code == 200, file.text
    batch = client.post("/v1/batches", json={"input_file_id": file.json()["id"],
                                             "endpoint": "/v1/audio/speech",
                                             "completion_window": "24h"})
    assert batch.status_code == 200, batch.text
    batch_id = batch.json()["id"]
    wait_until(lambda: client.get(f"/v1/batches/{batch_id}").json()["status"]
               == "in_progress", 120, f"batch {label} to be expanded")
    return batch_id


def test_a_small_batch_is_not_stuck_behind_a_big_one(fair: FairStack):
    with fair.client(fair.new_key("bulk-a")) as a, fair.client(fair.new_key("bulk-b")) as b:
        upload_batch(a, BIG, "a")
        queued_at = datetime.now(UTC)
        small = upload_batch(b, SMALL, "b")
        fair.start_workers(INSTANT, "bulk-0", "bulk-1")
        wait_until(lambda: b.get(f"/v1/batches/{small}").json()["request_counts"]
                   ["completed"] == SMALL, 90, "the small batch's jobs")
    rank = rank_of_last(fair.finished_since(INSTANT, queued_at), tenant_id(fair, "bulk-b"),
                        SMALL)
    print(f"bulk_tenant_b_done_within_first={rank}")
    assert rank <= WITHIN


def test_weights_three_to_one_split_the_service_three_to_one(fair: FairStack):
    heavy, light = fair.new_key("weight-3"), fair.new_key("weight-1")
    # as `omnijobs tenants weight weight-3 3` sets it, without a CLI process
    ShareRepository(make_sessionmaker(fair.engine)).set_weight("weight-3", 3)
    submit_many(fair, heavy, INSTANT, 300, "h")
    submit_many(fair, light, INSTANT, 300, "l")
    started = datetime.now(UTC)
    fair.start_worker("weights", INSTANT)
    wait_until(lambda: len(fair.finished_since(INSTANT, started)) >= 200, 90,
               "200 completions")
    first = [who for who, _ in fair.finished_since(INSTANT, started)[:200]]
    h, l_ = first.count(tenant_id(fair, "weight-3")), first.count(tenant_id(fair, "weight-1"))
    print(f"weighted_split={h}:{l_}")
    assert h + l_ == 200 and abs(h / l_ - 3) <= 0.3  # both wait all along: 3:1 within 10 %
