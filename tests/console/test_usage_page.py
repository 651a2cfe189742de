"""The console's Usage page reads the usage records (in-process over PostgreSQL; the
job's attempt is recorded through the repository as a worker records it): the tenant's
day shows the render seconds, the failed attempts' part and the media, and an
operator sees every tenant while a tenant sees only its own."""

from __future__ import annotations

from storage.records import OutputRecord

from . import test_sessions
from .test_sessions import new_key, signed_in, submit, tenant

api, console_db = test_sessions.api, test_sessions.console_db  # the same fixtures


def rendered(api, key: str, seconds: float, failed_first: float = 0.0) -> None:
    jobs = api.services.jobs
    job_id = submit(api, key, "Counted on the page.")
    attempt = jobs.claim(job_id, "w", lease_s=60).attempts
    if failed_first:
        jobs.requeue(job_id, attempt, queue="q", delay_s=0, code="timeout", message="slow",
                     render=(failed_first, "cpu"))
        attempt = jobs.claim(job_id, "w", lease_s=60).attempts
    assert jobs.complete(job_id, attempt, [OutputRecord(
        index=0, key=f"x/{job_id}/0.wav", content_type="audio/wav", bytes=4096,
        sha256="0" * 64, duration_s=2.5, sample_rate=16000, channels=1)], 3600,
        render=(seconds, "cpu"))


def test_the_usage_page_shows_the_usage_records(api):
    mine, theirs = tenant(), tenant()
    key, other = new_key(api, mine), new_key(api, theirs)
    rendered(api, key, 1.25, failed_first=0.5)
    rendered(api, key, 2.0)
    rendered(api, other, 7.0)
    page = signed_in(api, key).get("/console/usage?days=1")
    assert page.status_code == 200
    row = page.text.split(f">{mine}</h2>", 1)[1].split("</tbody>", 1)[0]
    cells = [c.split("</td>")[0] for c in row.split('<td class="num">')[1:]]
    # jobs ended, completed, render s, failed attempts s, characters, audio s, video s
    assert cells[:7] == ["2", "2", "3.75", "0.50", str(2 * len("Counted on the page.")),
                         "5.0", "0.0"]
    assert theirs not in page.text  # a tenant sees its own usage only
    operator = signed_in(api, new_key(api, tenant(), operator=True)).get("/console/usage")
    assert f">{mine}</h2>" in operator.text and f">{theirs}</h2>" in operator.text
