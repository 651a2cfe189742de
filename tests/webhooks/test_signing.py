"""Standard Webhooks signatures (checked with the standardwebhooks package and the openai
SDK), the event envelope and its 20 kB bound, and the retry decisions."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta

import pytest
from openai import InvalidWebhookSignatureError, OpenAI
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from core.settings import Settings
from storage.repositories.webhooks import FAILED, PENDING, STOPPED, SUCCEEDED, new_secret
from tasks.deliver import (
    MAX_BODY_BYTES,
    SendResult,
    event_body,
    next_step,
    parse_retry_after,
    signed_headers,
)

SDK = OpenAI(api_key="unused")


def _body() -> str:
    return event_body("evt_1", "speech.completed", datetime.now(UTC),
                      {"id": "job_1", "object": "job", "status": "completed", "outputs": []})


def test_secrets_have_32_random_bytes():
    import base64

    one, two = new_secret(), new_secret()
    assert one.startswith("whsec_") and one != two
    assert len(base64.b64decode(one.removeprefix("whsec_"))) == 32


def test_signature_verifies_with_both_libraries_and_only_with_the_right_secret():
    secret, body = new_secret(), _body()
    headers = signed_headers((secret,), "evt_1", int(time.time()), body)
    assert headers["webhook-id"] == "evt_1"
    assert headers["webhook-signature"].startswith("v1,")
    assert Webhook(secret).verify(body, headers)["type"] == "speech.completed"
    SDK.webhooks.verify_signature(body, headers, secret=secret)
    assert SDK.webhooks.unwrap(body, headers, secret=secret).type == "speech.completed"
    other = new_secret()
    with pytest.raises(WebhookVerificationError):
        Webhook(other).verify(body, headers)
    with pytest.raises(InvalidWebhookSignatureError):
        SDK.webhooks.verify_signature(body, headers, secret=other)
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(body.replace("completed", "failed"), headers)


def test_rotation_sends_two_signatures_and_each_secret_verifies():
    new, old, body = new_secret(), new_secret(), _body()
    headers = signed_headers((new, old), "evt_2", int(time.time()), body)
    assert len(headers["webhook-signature"].split(" ")) == 2
    for secret in (new, old):
        Webhook(secret).verify(body, headers)
        SDK.webhooks.verify_signature(body, headers, secret=secret)


def test_envelope_is_openais_with_the_resource_first():
    when = datetime(2026, 1, 2, tzinfo=UTC)
    event = json.loads(event_body("evt_3", "video.failed", when,
                                  {"id": "video_1", "object": "video"}))
    assert list(event) == ["id", "object", "type", "created_at", "data"]
    assert event["object"] == "event" and event["created_at"] == int(when.timestamp())
    assert list(event["data"])[0] == "id"


def _video(prompt: str, outputs: int = 4) -> dict:
    return {"id": "video_1", "object": "video", "prompt": prompt, "metadata": None,
            "outputs": [{"index": i, "url": "https://store.example/" + "x" * 900,
                         "url_expires_at": 1, "bytes": 10} for i in range(outputs)]}


def test_small_events_keep_their_urls():
    event = json.loads(event_body("evt_4", "video.completed", datetime.now(UTC), _video("p")))
    assert "outputs_truncated" not in event["data"]
    assert all(o["url"] for o in event["data"]["outputs"])


def test_events_over_20_kb_drop_the_urls_and_say_so():
    data = _video("p" * 16_000)
    assert len(json.dumps(data)) > MAX_BODY_BYTES
    body = event_body("evt_5", "video.completed", datetime.now(UTC), data)
    assert len(body.encode()) <= MAX_BODY_BYTES
    event = json.loads(body)
    assert event["data"]["outputs_truncated"] is True
    assert [o["index"] for o in event["data"]["outputs"]] == [0, 1, 2, 3]
    assert all("url" not in o and o["bytes"] == 10 for o in event["data"]["outputs"])
    assert event["data"]["prompt"] == "p" * 16_000


def test_even_larger_events_shed_free_text_last():
    body = event_body("evt_6", "video.completed", datetime.now(UTC), _video("é" * 30_000))
    event = json.loads(body)
    assert len(body.encode()) <= MAX_BODY_BYTES
    assert event["data"]["outputs_truncated"] is True and event["data"]["prompt"] is None
    assert event["data"]["id"] == "video_1"


SCHEDULE = Settings(webhook_retry_schedule_s=[0, 10, 100])


@pytest.mark.parametrize(("code", "expected"), [
    (200, SUCCEEDED), (204, SUCCEEDED), (299, SUCCEEDED), (410, STOPPED),
    (301, PENDING), (302, PENDING), (400, PENDING), (500, PENDING), (None, PENDING)])
def test_only_2xx_succeeds_and_410_stops(code, expected):
    status, next_at = next_step(SCHEDULE, 0, SendResult(code, None, 5))
    assert status == expected
    assert (next_at is not None) == (expected == PENDING)


def test_retries_follow_the_schedule_with_jitter_then_give_up():
    before = datetime.now(UTC)
    _, first = next_step(SCHEDULE, 0, SendResult(500, None, 5))
    _, second = next_step(SCHEDULE, 1, SendResult(500, None, 5))
    assert timedelta(seconds=9) <= first - before <= timedelta(seconds=11.1)
    assert timedelta(seconds=90) <= second - before <= timedelta(seconds=110.1)
    assert next_step(SCHEDULE, 2, SendResult(500, None, 5)) == (FAILED, None)


@pytest.mark.parametrize("code", [429, 502, 503, 504])
def test_retry_after_is_honoured_for_throttling_and_gateway_errors(code):
    before = datetime.now(UTC)
    status, next_at = next_step(SCHEDULE, 0, SendResult(code, None, 5, retry_after_s=42))
    assert status == PENDING
    assert timedelta(seconds=41.9) <= next_at - before <= timedelta(seconds=43)


def test_retry_after_is_ignored_for_other_codes_and_capped():
    before = datetime.now(UTC)
    _, next_at = next_step(SCHEDULE, 0, SendResult(500, None, 5, retry_after_s=42))
    assert next_at - before <= timedelta(seconds=11.1)
    _, capped = next_step(SCHEDULE, 0, SendResult(429, None, 5, retry_after_s=10**6))
    assert capped - before <= timedelta(hours=24, seconds=1)


def test_parse_retry_after():
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    from email.utils import format_datetime

    later = format_datetime(datetime.now(UTC) + timedelta(seconds=120), usegmt=True)
    assert 100 < parse_retry_after(later) <= 120


def test_schedule_must_start_immediately():
    with pytest.raises(ValueError):
        Settings(webhook_retry_schedule_s=[5, 10])
    assert Settings().webhook_retry_schedule_s[:3] == [0, 5, 300]
    assert len(Settings().webhook_retry_schedule_s) == 10
