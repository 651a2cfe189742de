"""The console's browser tests: Debian's chromium, driven by Playwright, against a real
stack of its own (API, worker and maintenance processes over PostgreSQL, Redis and
SeaweedFS) and a local webhook receiver. Every request the browser makes is recorded;
one that leaves the API's origin is refused and fails the test that made it."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from ..conftest import migrated_database, stack_env
from ..services import Stack, free_port, redis_url, spawn, unavailable, wait_until
from ..webhooks.receiver import Receiver

CHROMIUM = os.environ.get("OMNIJOBS_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync",
                 "--autoplay-policy=no-user-gesture-required"]
RENDERED = ["piper-joe", "reference-t2va", "test-sleep", "test-slow"]
# Screenshots go to a temporary folder, or where OMNIJOBS_CONSOLE_SCREENSHOTS says
# (docs/console/ holds the README's, taken that way).
SHOTS = os.environ.get("OMNIJOBS_CONSOLE_SCREENSHOTS")


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture(scope="module")
def console_stack(seaweedfs, tmp_path_factory) -> Iterator[Stack]:
    home = tmp_path_factory.mktemp("console-stack")
    db = migrated_database()
    env = stack_env(next(db), redis_url(), seaweedfs, home,
                    OMNIJOBS_WEBHOOK_ALLOWED_NETWORKS='["127.0.0.0/8"]',
                    OMNIJOBS_WEBHOOK_RETRY_SCHEDULE_S="[0]",  # one attempt: a 500 fails it
                    OMNIJOBS_WEBHOOK_TIMEOUT_S="5", OMNIJOBS_EVENT_RESYNC_S="1",
                    OMNIJOBS_SIGNED_URL_TTL_S="3600")
    port = free_port()
    st = Stack(base_url=f"http://127.0.0.1:{port}", env=env)
    try:
        st.processes["api"] = spawn("api", ["api", "--port", str(port)], env, home)
        st.processes["worker"] = spawn(
            "worker", ["worker", *(a for p in RENDERED for a in ("--pipeline", p))], env, home)
        st.processes["maintenance"] = spawn("maintenance", ["maintenance"], env, home)
        wait_until(lambda: httpx.get(f"{st.base_url}/readyz", timeout=2).status_code == 200,
                   60, "API")
        for name in ("worker", "maintenance"):
            wait_until(lambda n=name: "ready" in st.processes[n].log.read_text(), 90, name)
        yield st
    finally:
        st.stop()
        next(db, None)


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists() or shutil.which(CHROMIUM) is None:
        unavailable(f"chromium ({CHROMIUM}; apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


class Recorder:
    """Every request a page makes; those for another origin are aborted and kept."""

    def __init__(self, origin: str) -> None:
        self.origin = origin
        self.requests: list[str] = []
        self.elsewhere: list[str] = []

    def route(self, route) -> None:
        url = route.request.url
        self.requests.append(url)
        if _origin(url) == self.origin:
            route.continue_()
        else:
            self.elsewhere.append(url)
            route.abort()


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


@pytest.fixture
def context(browser, console_stack):
    """A fresh browser profile (no cookies) whose every request is recorded; the test
    fails if any went to another origin."""
    ctx = browser.new_context(viewport={"width": 1100, "height": 760}, base_url=
                              console_stack.base_url)
    recorder = Recorder(_origin(console_stack.base_url))
    ctx.route("**/*", recorder.route)
    ctx.recorder = recorder
    yield ctx
    ctx.close()
    assert recorder.requests, "the browser made no request at all"
    assert recorder.elsewhere == [], f"requests left the origin: {recorder.elsewhere}"


def sign_in(page, key: str, path: str = "/console") -> None:
    page.goto(path)
    page.wait_for_url(re.compile(r"/console/sign-in"))
    page.fill("#key", key)
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r"/console(?!/sign-in)"))


def screenshot(page, name: str, tmp_path: Path) -> Path:
    folder = Path(SHOTS) if SHOTS else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    page.screenshot(path=str(path), full_page=False)
    return path
