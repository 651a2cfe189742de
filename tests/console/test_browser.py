"""The console in a real browser (Debian's chromium through Playwright) against a real
API, worker, maintenance process, PostgreSQL, Redis and SeaweedFS. What each test checks
is in its docstring; docs/console.md lists them too."""

from __future__ import annotations

import json
import re
import uuid

import pytest
from standardwebhooks import Webhook

from ..integration.helpers import wait_job
from ..services import wait_until
from ..webhooks.receiver import Reply
from .conftest import screenshot, sign_in

pytestmark = pytest.mark.integration
ASYNC = {"Prefer": "respond-async"}


def tenant(stack, name: str):
    """A fresh tenant: (name, API key, an httpx client with the key)."""
    full = f"{name}-{uuid.uuid4().hex[:6]}"
    key = stack.new_key(full)
    return full, key, stack.client(key)


def speech(client, text: str, model: str = "tts-1", **extra) -> dict:
    resp = client.post("/v1/audio/speech", headers=ASYNC,
                       json={"model": model, "input": text, **extra})
    assert resp.status_code == 202, resp.text
    return resp.json()


def busy_worker(client) -> dict:
    """Occupy the stack's one worker (test-sleep, a minute) until it is cancelled, so
    a job submitted meanwhile stays queued."""
    job = speech(client, "60", model="test-sleep")
    wait_job(client, job["id"], until=lambda j: j["status"] == "running")
    return job


@pytest.fixture(scope="module")
def acme(console_stack):
    name, key, client = tenant(console_stack, "acme")
    with client:
        yield name, key, client


@pytest.fixture(scope="module")
def globex(console_stack):
    name, key, client = tenant(console_stack, "globex")
    with client:
        yield name, key, client


@pytest.fixture(scope="module")
def acme_spoken(acme) -> dict:
    """A completed speech job of acme's (mp3, Piper)."""
    job = speech(acme[2], "Hello from the console. This sentence is spoken by Piper.")
    job = wait_job(acme[2], job["id"], timeout=120)
    assert job["status"] == "completed", job
    return job


def test_a_tenant_key_sees_only_its_own_jobs(context, acme, globex, tmp_path):
    """Signed in with acme's key, the Jobs page lists acme's job and not globex's, and
    globex's job page is a 404; the key appears in no page and no cookie."""
    mine = speech(acme[2], "Mine.", model="test-sleep")
    theirs = speech(globex[2], "Theirs.", model="test-sleep")
    page = context.new_page()
    sign_in(page, acme[1], "/console/jobs")
    assert page.locator(f"#row-{mine['id']}").count() == 1
    assert page.locator(f"#row-{theirs['id']}").count() == 0
    assert acme[1] not in page.content()
    cookies = {c["name"]: c for c in context.cookies()}
    session = cookies["omnijobs_console"]
    assert session["httpOnly"] and session["sameSite"] == "Strict"
    assert session["path"] == "/console" and acme[1] not in session["value"]
    resp = page.goto(f"/console/jobs/{theirs['id']}")
    assert resp.status == 404
    assert f"no job with id '{theirs['id']}'" in page.locator("main").inner_text()


def test_a_speech_job_goes_from_queued_to_completed_without_a_reload(context, acme):
    """The Jobs page is open; a job submitted through the API appears as queued (the
    worker is busy), then turns completed once the worker is free, while the page is
    never reloaded (a marker set in the page survives) and never polls: the only
    requests after the page loaded are its one event stream."""
    blocker = busy_worker(acme[2])
    page = context.new_page()
    sign_in(page, acme[1], "/console/jobs")
    page.wait_for_function("() => document.body.dataset.live === 'open'")
    page.evaluate("window.notReloaded = true")
    loaded = len(context.recorder.requests)
    job = speech(acme[2], "Watch this row.")
    row = page.locator(f"#row-{job['id']}")
    row.wait_for(timeout=30_000)
    assert row.get_attribute("data-status") == "queued"
    acme[2].post(f"/v1/jobs/{blocker['id']}/cancel")
    page.wait_for_selector(f"#row-{job['id']}[data-status=completed]", timeout=120_000)
    assert page.evaluate("window.notReloaded") is True
    later = context.recorder.requests[loaded:]
    assert later == [] or all("/console/live/jobs" in url for url in later), later


def test_the_audio_plays_and_its_duration_is_the_stored_one(context, acme, acme_spoken,
                                                            tmp_path):
    """The job page's <audio> loads through the console's own URL and plays (its
    currentTime moves); the element's duration is the stored output's duration_s within
    one MP3 frame (1152 samples at 22,050 Hz is 52 ms; the encoder's padding)."""
    out = acme_spoken["outputs"][0]
    page = context.new_page()
    sign_in(page, acme[1], f"/console/jobs/{acme_spoken['id']}")
    audio = page.locator("#player-0")
    page.wait_for_function("() => document.getElementById('player-0').readyState >= 1")
    duration = audio.evaluate("a => a.duration")
    assert abs(duration - out["duration_s"]) <= 0.053, (duration, out["duration_s"])
    audio.evaluate("a => a.play()")
    page.wait_for_function("() => document.getElementById('player-0').currentTime > 0.2")
    assert out["sha256"] in page.content()
    screenshot(page, "job-audio", tmp_path)


@pytest.fixture(scope="module")
def acme_video(acme) -> dict:
    resp = acme[2].post("/v1/videos", json={"model": "sora-2", "prompt": "A lighthouse at dusk",
                                            "seconds": "2", "size": "256x144"})
    assert resp.status_code == 200, resp.text
    job = wait_job(acme[2], resp.json()["id"], timeout=180)
    assert job["status"] == "completed", job
    return job


def test_the_video_seeks_to_half_its_length(context, acme, acme_video, tmp_path):
    """The stored H.264/AAC MP4 in the job page's <video>: chromium says it can play it
    (canPlayType), its duration is the stored one within a frame, a seek to half its
    length lands there (currentTime within a frame) through a byte-range request (206)
    and the frame there decodes (readyState >= HAVE_CURRENT_DATA, decoded frames > 0,
    the stored width and height)."""
    out = acme_video["outputs"][0]
    page = context.new_page()
    ranges = []
    page.on("response", lambda r: ranges.append(r.status) if "/outputs/0" in r.url else None)
    sign_in(page, acme[1], f"/console/jobs/{acme_video['id']}")
    video = page.locator("#player-0")
    assert video.evaluate("v => v.canPlayType('video/mp4; codecs=\"avc1.42E01E, mp4a.40.2\"')"
                          ) in ("probably", "maybe")
    page.wait_for_function("() => document.getElementById('player-0').readyState >= 1")
    frame = 1 / out["fps"]
    duration = video.evaluate("v => v.duration")
    assert abs(duration - out["duration_s"]) <= frame + 0.025, (duration, out["duration_s"])
    half = duration / 2
    landed = video.evaluate("""(v, t) => new Promise(done => {
        v.addEventListener('seeked', () => done(v.currentTime), {once: true});
        v.currentTime = t; })""", half)
    assert abs(landed - half) <= frame, (landed, half)
    page.wait_for_function("() => document.getElementById('player-0').readyState >= 2")
    video.evaluate("v => v.play()")
    page.wait_for_function("() => document.getElementById('player-0')"
                           ".getVideoPlaybackQuality().totalVideoFrames > 0")
    assert video.evaluate("v => [v.videoWidth, v.videoHeight]") == [out["width"], out["height"]]
    assert 206 in ranges, ranges
    video.evaluate("v => { v.pause(); v.currentTime = v.duration / 2; }")
    screenshot(page, "job-video", tmp_path)


def test_a_running_job_is_cancelled_from_its_page_and_its_progress_moves(context, acme):
    """A job's page shows its progress bar moving while it renders (a value strictly
    between 0 and 100 is seen, pushed by the job's notices), then a running job is
    cancelled with the page's button: the page and the API both say cancelled."""
    slow = speech(acme[2], "Slowly.", model="test-slow")
    page = context.new_page()
    sign_in(page, acme[1], f"/console/jobs/{slow['id']}")
    page.wait_for_function("""() => {
        const p = document.querySelector('#job-status progress');
        return p && p.value > 0 && p.value < 100; }""", timeout=60_000)
    page.wait_for_selector("#job-status .s-completed", timeout=60_000)
    assert page.locator("#job-status progress").evaluate("p => p.value") == 100

    job = speech(acme[2], "60", model="test-sleep")
    wait_job(acme[2], job["id"], until=lambda j: j["status"] == "running")
    page.goto(f"/console/jobs/{job['id']}")
    assert page.locator("#job-status .s-running").count() == 1
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#cancel")
    page.wait_for_selector("#job-status .s-cancelled")
    assert "cancelled" in page.locator("p.notice").inner_text()
    assert acme[2].get(f"/v1/jobs/{job['id']}").json()["status"] == "cancelled"


def test_a_failed_delivery_is_replayed_and_the_new_attempt_shows(context, console_stack,
                                                                  acme, receiver):
    """A job's webhook_url answers 500: with one attempt in the schedule the delivery
    fails. After the tenant's default secret is rotated, Replay on the job page sends it
    again: the new attempt appears on the page by itself (200), the receiver got the
    same webhook-id twice, and the replay verifies with the new secret."""
    receiver.reply("/replay", Reply(500))
    job = speech(acme[2], "Call me back.", webhook_url=receiver.url("/replay"))
    wait_job(acme[2], job["id"], timeout=120)

    def log():
        return acme[2].get(f"/v1/jobs/{job['id']}/webhook_deliveries").json()["data"]
    wait_job(acme[2], job["id"], until=lambda _j: log() and log()[0]["status"] == "failed")
    secret = console_stack.cli("webhooks", "secret", "--tenant", acme[0], "--rotate"
                               ).strip().splitlines()[-1]
    page = context.new_page()
    sign_in(page, acme[1], f"/console/jobs/{job['id']}")
    delivery = page.locator(f"#{log()[0]['id']}")
    assert delivery.locator("tr.attempt").count() == 1
    delivery.locator("button", has_text="Replay").click()
    assert "due again" in page.locator("p.notice").inner_text()
    page.wait_for_function(f"""() => document.querySelectorAll(
        '#{log()[0]['id']} tr.attempt').length === 2""", timeout=60_000)
    assert delivery.locator("tr.attempt").nth(1).locator("td").nth(3).inner_text() == "200"
    first, again = receiver.wait_for("/replay", 2)
    assert first.headers["webhook-id"] == again.headers["webhook-id"]
    event = Webhook(secret).verify(again.body, again.headers)
    assert event["data"]["id"] == job["id"]


def test_a_batch_shows_its_progress_counts_and_files(context, acme, tmp_path):
    """A two-line speech batch, finished by the worker: the Batches page shows it
    completed with a full progress bar and its counts, and its output file link
    downloads the two result lines; a second batch is cancelled from the page."""
    lines = [json.dumps({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/audio/speech",
                         "body": {"model": "tts-1", "input": f"Line {i}."}}) for i in range(2)]
    upload = acme[2].post("/v1/files", data={"purpose": "batch"},
                          files={"file": ("two.jsonl", "\n".join(lines).encode())}).json()

    def create() -> dict:
        resp = acme[2].post("/v1/batches", json={"input_file_id": upload["id"],
                                                 "endpoint": "/v1/audio/speech",
                                                 "completion_window": "24h"})
        assert resp.status_code == 200, resp.text
        return resp.json()
    done = create()
    wait_job(acme[2], done["id"], timeout=180, until=lambda _b: acme[2].get(
        f"/v1/batches/{done['id']}").json()["status"] == "completed")
    page = context.new_page()
    sign_in(page, acme[1], "/console/batches")
    row = page.locator("tr", has=page.locator(f"a[href='/console/jobs?batch={done['id']}']"))
    assert "completed" in row.inner_text()
    assert row.locator("progress").evaluate("p => [p.value, p.max]") == [2, 2]
    with page.expect_download() as download:
        row.locator("a", has_text="output").click()
    results = download.value.path().read_text().splitlines()
    assert sorted(json.loads(r)["custom_id"] for r in results) == ["line-0", "line-1"]
    blocker = busy_worker(acme[2])
    other = create()
    page.goto("/console/batches")
    target = page.locator("tr", has=page.locator(
        f"a[href='/console/jobs?batch={other['id']}']"))
    page.once("dialog", lambda dialog: dialog.accept())
    target.locator("button", has_text="Cancel").click()
    assert "cancelling" in page.locator("p.notice").inner_text()
    assert acme[2].get(f"/v1/batches/{other['id']}").json()["status"] in ("cancelling",
                                                                           "cancelled")
    acme[2].post(f"/v1/jobs/{blocker['id']}/cancel")


def test_a_webhook_endpoint_shows_its_deliveries_rotates_and_sends_a_test(
        context, acme, receiver, tmp_path):
    """A registered endpoint's page: its recent delivery and failure rate, a secret
    rotated from the page (shown once, and the receiver's next event verifies with it),
    and a test event sent from the page (the receiver got it; the page says 200)."""
    created = acme[2].post("/v1/webhook_endpoints", json={
        "name": "receiver", "url": receiver.url("/endpoint"),
        "event_types": ["speech.completed"]}).json()
    job = speech(acme[2], "For the endpoint.")
    wait_job(acme[2], job["id"], timeout=120)
    receiver.wait_for("/endpoint", 1)
    page = context.new_page()
    sign_in(page, acme[1], "/console/webhooks")
    card = page.locator(f"#{created['id']}")
    card.locator(f"a[href^='/console/jobs/{job['id']}']").wait_for()
    assert "0.0 % of 1 attempts" in card.inner_text()
    page.once("dialog", lambda dialog: dialog.accept())
    card.locator("button", has_text="Rotate secret").click()
    secret = page.locator("code.secret").inner_text()
    assert secret.startswith("whsec_") and secret != created["signing_secret"]
    page.goto("/console/webhooks")
    card.locator("select[name=event_type]").select_option("speech.completed")
    card.locator("button", has_text="Send a test event").click()
    assert "answered 200" in page.locator("p.notice").inner_text()
    test_event = receiver.wait_for("/endpoint", 2)[-1]
    assert Webhook(secret).verify(test_event.body, test_event.headers)["type"] == (
        "speech.completed")


def test_an_operator_sees_two_tenants(context, console_stack, acme, globex, tmp_path):
    """An operator's key (keys create --operator) lists acme's and globex's jobs, with
    their tenants named, and opens either's job page; a tenant filter narrows to one."""
    a = speech(acme[2], "From acme.", model="test-sleep")
    g = speech(globex[2], "From globex.", model="test-sleep")
    op_key = console_stack.cli("keys", "create", "--tenant", "ops-" + uuid.uuid4().hex[:6],
                               "--operator").strip().splitlines()[-1]
    page = context.new_page()
    sign_in(page, op_key, "/console/jobs")
    assert page.locator(".badge.op").count() == 1
    rows = page.locator("#job-rows")
    assert rows.locator(f"#row-{a['id']}").count() == 1
    assert rows.locator(f"#row-{g['id']}").count() == 1
    assert acme[0] in rows.locator(f"#row-{a['id']}").inner_text()
    assert globex[0] in rows.locator(f"#row-{g['id']}").inner_text()
    screenshot(page, "jobs", tmp_path)
    assert page.goto(f"/console/jobs/{g['id']}").status == 200
    page.goto("/console/jobs")
    page.select_option("select[name=tenant]", label=globex[0])
    page.click("form.filters button[type=submit]")
    assert page.locator(f"#row-{g['id']}").count() == 1
    assert page.locator(f"#row-{a['id']}").count() == 0
    for name, path in (("overview", "/console"), ("batches", "/console/batches"),
                       ("webhooks", "/console/webhooks"), ("workers", "/console/workers"),
                       ("usage", "/console/usage")):
        assert page.goto(path).status == 200
        screenshot(page, name, tmp_path)


def test_the_workers_page_shows_the_registry(context, console_stack, acme):
    """The Workers page reads the worker registry: an operator sees the stack's worker
    process with its pipelines, its slots, busy with the job it renders (linked), and the Overview
    counts it among the pipeline's live workers; a tenant's key sees the count per
    pipeline and no hosts or processes."""
    job = busy_worker(acme[2])
    op_key = console_stack.cli("keys", "create", "--tenant", "ops-" + uuid.uuid4().hex[:6],
                               "--operator").strip().splitlines()[-1]
    page = context.new_page()
    sign_in(page, op_key, "/console/workers")
    row = page.locator("#workers tbody tr", has_text=job["id"])
    # The worker writes its row when it claims a job; the page is read when drawn.
    wait_until(lambda: (page.reload(), row.count())[1] == 1, 20, "the busy worker's row")
    assert "test-sleep" in row.inner_text() and "busy" in row.inner_text()
    assert row.locator(f"a[href='/console/jobs/{job['id']}']").count() == 1
    assert row.locator("td.slots").inner_text().endswith("/1")  # held of one slot
    page.goto("/console")
    cells = page.locator("#queues ~ div table tbody tr", has_text="test-sleep")
    assert cells.count() >= 1 and cells.first.locator("td").last.inner_text() == "1"

    context.clear_cookies()  # the same browser, signed in with the tenant's key instead
    tenant_page = context.new_page()
    sign_in(tenant_page, acme[1], "/console/workers")
    assert tenant_page.locator("#workers").count() == 0
    served = tenant_page.locator("td[data-pipeline='test-sleep']")
    assert served.count() >= 1 and served.first.inner_text() == "1"
    assert acme[2].post(f"/v1/jobs/{job['id']}/cancel").status_code == 200
    wait_job(acme[2], job["id"])


def test_an_action_without_its_csrf_token_is_refused(context, acme):
    """A POST from the signed-in page without the session's CSRF token (or with another)
    is a 403 and changes nothing; the same POST with the page's token cancels."""
    job = speech(acme[2], "60", model="test-sleep")  # still queued or running at the end
    page = context.new_page()
    sign_in(page, acme[1], f"/console/jobs/{job['id']}")
    post = """([url, token]) => fetch(url, {method: 'POST', redirect: 'manual',
        body: new URLSearchParams(token === null ? {} : {csrf: token})}).then(r => r.status)"""
    url = f"/console/jobs/{job['id']}/cancel"
    assert page.evaluate(post, [url, None]) == 403
    assert page.evaluate(post, [url, "not-the-token"]) == 403
    assert acme[2].get(f"/v1/jobs/{job['id']}").json()["status"] != "cancelled"
    token = page.locator("input[name=csrf]").first.get_attribute("value")
    assert page.evaluate(post, [url, token]) in (0, 303)  # an opaque redirect is 0
    assert acme[2].get(f"/v1/jobs/{job['id']}").json()["status"] == "cancelled"


def test_no_request_leaves_the_origin_and_docs_work_offline(context, acme, tmp_path):
    """Every page, /docs included, loads with requests to this origin only (the context
    aborts and records any other; it checks none was made). /docs renders Swagger UI
    from the package's files with its operations listed, under a CSP of 'self'. At phone
    width a page does not scroll sideways, and the keyboard reaches the navigation."""
    page = context.new_page()
    violations = []
    page.on("console", lambda m: violations.append(m.text)
            if "Content Security Policy" in m.text else None)
    resp = page.goto("/docs")
    assert "default-src 'none'" in resp.headers["content-security-policy"]
    page.wait_for_selector(".swagger-ui .opblock", timeout=60_000)
    assert page.locator(".swagger-ui .info .title").inner_text().startswith("omnijobs")
    screenshot(page, "docs", tmp_path)
    sign_in(page, acme[1])
    for path in ("/console", "/console/jobs", "/console/batches", "/console/webhooks",
                 "/console/workers", "/console/usage"):
        page.goto(path)
    assert violations == [], violations
    page.set_viewport_size({"width": 390, "height": 800})
    page.goto("/console/jobs")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    for _ in range(12):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.textContent") == "Usage":
            break
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r"/console/usage"))
    assert json.dumps(context.recorder.requests)  # recorded; the fixture checks origins
