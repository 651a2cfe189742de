"""The key is checked before the body is read, and bodies are capped (413) without
reading the rest; file parts are refused where no file is accepted."""

from __future__ import annotations

import json
import socket
import uuid
from urllib.parse import urlsplit

import pytest
from fastapi import APIRouter, Request

from api.guard import GuardedRoute, body_limit

from ..integration.helpers import assert_openai_error

MIB = 1 << 20


def _tenant() -> str:
    return "guard-" + uuid.uuid4().hex[:8]


def test_anonymous_invalid_json_is_401_not_400(api):
    with api.client() as anon:
        resp = anon.post("/v1/audio/speech", content=b"{not json",
                         headers={"Content-Type": "application/json"})
    assert_openai_error(resp, 401, "invalid_api_key")


def test_anonymous_multipart_is_401(api):
    with api.client() as anon:
        resp = anon.post("/v1/videos", data={"prompt": "x"},
                         files={"input_reference": ("a.png", b"\x89PNG" * 100, "image/png")})
    assert_openai_error(resp, 401, "invalid_api_key")


def test_json_body_over_the_limit_is_413(api):
    body = json.dumps({"model": "tts-1", "input": "a" * (2 * MIB)}).encode()
    with api.client(_tenant()) as client:
        resp = client.post("/v1/audio/speech", content=body,
                           headers={"Content-Type": "application/json"})
        assert_openai_error(resp, 413, "request_too_large")
        assert client.get("/v1/jobs").json()["data"] == []


def test_multipart_file_over_the_limit_is_413(api):
    with api.client(_tenant()) as client:
        resp = client.post("/v1/videos", data={"prompt": "A lighthouse."},
                           files={"input_reference": ("a.png", b"\0" * (3 * MIB), "image/png")})
        assert_openai_error(resp, 413, "request_too_large")
        assert client.get("/v1/videos").json()["data"] == []


def test_file_part_where_no_file_is_accepted_is_400(api):
    with api.client(_tenant()) as client:
        resp = client.post("/v1/videos", data={"prompt": "A lighthouse."},
                           files={"input_reference": ("a.png", b"\x89PNG" * 10, "image/png")})
        err = assert_openai_error(resp, 400, "unsupported_parameter")
        assert err["param"] == "input_reference"
        assert client.get("/v1/videos").json()["data"] == []


# ---- against the real server: nothing beyond the headers is read ----------------------

def _raw_request(base_url: str, head: str, body_chunks=(), timeout: float = 20) -> bytes:
    """Send the head (and optionally some body), then read whatever the server answers."""
    url = urlsplit(base_url)
    with socket.create_connection((url.hostname, url.port), timeout=timeout) as sock:
        sock.sendall(head.encode())
        try:
            for chunk in body_chunks:
                sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before taking it all: that is the point
        data = b""
        while b"\r\n\r\n" not in data:
            block = sock.recv(65536)
            if not block:
                break
            data += block
        return data


@pytest.fixture(scope="module")
def stack_key(stack) -> str:
    return stack.new_key(_tenant())


@pytest.mark.parametrize("with_key", [True, False], ids=["key", "anonymous"])
def test_declared_length_over_the_limit_is_answered_without_the_body(stack, stack_key,
                                                                       with_key):
    auth = f"Authorization: Bearer {stack_key}\r\n" if with_key else ""
    head = ("POST /v1/audio/speech HTTP/1.1\r\nHost: test\r\n"
            f"{auth}Content-Type: application/json\r\nContent-Length: {1 << 30}\r\n\r\n")
    answer = _raw_request(stack.base_url, head)  # no body sent at all
    status = 413 if with_key else 401
    assert answer.startswith(f"HTTP/1.1 {status}".encode()), answer[:200]


def test_chunked_body_over_the_limit_is_cut_off(stack, stack_key):
    head = ("POST /v1/audio/speech HTTP/1.1\r\nHost: test\r\n"
            f"Authorization: Bearer {stack_key}\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n")
    block = b"a" * 65536
    chunks = [b"%x\r\n%s\r\n" % (len(block), block)] * 17  # 1 MiB + 64 KiB, no terminator
    answer = _raw_request(stack.base_url, head, chunks)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]


def test_a_route_may_declare_its_own_body_limit(make_api):
    uploads = APIRouter(route_class=GuardedRoute)

    @uploads.post("/v1/test-uploads")
    @body_limit(lambda settings: 3 * MIB)
    async def upload(request: Request) -> dict:
        return {"bytes": len(await request.body())}

    built = make_api()
    built.app.include_router(uploads)
    with built.client(_tenant()) as client:
        assert client.post("/v1/test-uploads", content=b"\0" * (2 * MIB)).json() == {
            "bytes": 2 * MIB}
        assert_openai_error(client.post("/v1/test-uploads", content=b"\0" * (4 * MIB)), 413,
                            "request_too_large")
        assert_openai_error(client.post("/v1/audio/speech", content=b"\0" * (2 * MIB),
                                        headers={"Content-Type": "application/json"}), 413)


def test_streamed_body_is_cut_off_at_the_declared_limit(make_api):
    """No Content-Length: the limit is counted as the body arrives."""
    built = make_api()

    def chunks():
        for _ in range(20):
            yield b" " * 65536  # 1.25 MiB of JSON whitespace in all

    with built.client(_tenant()) as client:
        resp = client.post("/v1/audio/speech", content=chunks(),
                           headers={"Content-Type": "application/json"})
    assert_openai_error(resp, 413, "request_too_large")
