"""A real local HTTP receiver for webhook tests: records every request and answers with
scripted responses per path (default 200), optionally holding a request open, answering
late, trickling its headers a byte at a time or flooding them."""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from openai import OpenAI
from standardwebhooks import Webhook


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float


@dataclass
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    hold: threading.Event | None = None  # answer only once this is set
    delay_s: float = 0.0  # answer this long after the request arrived
    trickle_s: float | None = None  # send the headers one byte per this many seconds
    flood_bytes: int = 0  # send a header this long


PREFIX = "/rcv-"  # each receiver's URLs start with this and a token of its own


class _Handler(BaseHTTPRequestHandler):
    server: ThreadingHTTPServer  # with .receiver, the Receiver it answers for

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        receiver = self.server.receiver
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        path = receiver._own(self.path)
        if path is None:  # a retry meant for an earlier receiver on this port
            self.send_response(404)
            self.send_header("content-length", "0")
            self.end_headers()
            return
        self.path = path
        reply = receiver._next(self.path)
        with receiver.arrived:
            receiver.received.append(Received(
                self.path, {k.lower(): v for k, v in self.headers.items()}, body,
                time.time()))
            receiver.arrived.notify_all()
        if reply.hold is not None:
            reply.hold.wait(60)
        time.sleep(reply.delay_s)
        try:
            if reply.trickle_s is not None or reply.flood_bytes:
                self._raw(reply)
                return
            self.send_response(reply.status)
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.send_header("content-length", "0")
            self.end_headers()
        except OSError:  # the sender closed the connection
            receiver.cut.setdefault(self.path, threading.Event()).set()

    def _raw(self, reply: Reply) -> None:
        head = (f"HTTP/1.1 {reply.status} OK\r\nx-pad: " + "a" * reply.flood_bytes
                + "\r\ncontent-length: 0\r\n\r\n").encode()
        if reply.trickle_s is None:
            self.wfile.write(head)
            self.wfile.flush()
            return
        for i in range(len(head)):  # ~40 bytes: 20 s at 0.5 s a byte
            self.wfile.write(head[i:i + 1])
            self.wfile.flush()
            time.sleep(reply.trickle_s)

    def log_message(self, *_args) -> None:
        pass


class Receiver:
    def __init__(self) -> None:
        self.received: list[Received] = []
        self.script: dict[str, list[Reply]] = {}
        self.arrived = threading.Condition()
        self.cut: dict[str, threading.Event] = {}  # per path: the sender hung up on us
        self.prefix = f"{PREFIX}{uuid.uuid4().hex[:8]}"
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.receiver = self
        self.server.daemon_threads = True
        self.server.handle_error = lambda *_args: None  # a sender that hung up mid-reply
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def hung_up(self, path: str, timeout: float = 60) -> bool:
        """Whether the sender closed a connection to ``path`` before we were done."""
        return self.cut.setdefault(path, threading.Event()).wait(timeout)

    def url(self, path: str) -> str:
        """``path`` on this receiver, under a prefix of its own: a stack that outlives
        an earlier receiver may still retry a delivery to it, and the kernel may give
        this receiver the same port; such a request is answered 404 and not counted."""
        return f"http://127.0.0.1:{self.port}{self.prefix}{path}"

    def _own(self, path: str) -> str | None:
        """The path a test named (``url``), or None for another receiver's."""
        if path.startswith(self.prefix + "/"):
            return path[len(self.prefix):]
        return None if path.startswith(PREFIX) else path  # a URL built by hand: ours

    def reply(self, path: str, *replies: Reply) -> None:
        self.script.setdefault(path, []).extend(replies)

    def _next(self, path: str) -> Reply:
        queue = self.script.get(path)
        return queue.pop(0) if queue else Reply()

    def at(self, path: str) -> list[Received]:
        return [r for r in self.received if r.path == path]

    def wait_for(self, path: str, count: int = 1, timeout: float = 60) -> list[Received]:
        deadline = time.monotonic() + timeout
        with self.arrived:
            while len(self.at(path)) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{len(self.at(path))} of {count} deliveries to "
                                         f"{path} arrived in {timeout}s")
                self.arrived.wait(left)
            return self.at(path)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def verify(received: Received, secret: str) -> dict:
    """Verify with both the standardwebhooks package and the openai SDK; the event."""
    event = Webhook(secret).verify(received.body, received.headers)
    OpenAI(api_key="unused").webhooks.verify_signature(received.body, received.headers,
                                                       secret=secret)
    return event
