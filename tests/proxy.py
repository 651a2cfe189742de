"""A TCP proxy the tests can cut, stall and restore: a dependency going down, or hanging,
and coming back (PostgreSQL, Redis, S3) for one process, while the real service keeps
running for the others.

Cut, it accepts and closes at once, as a host whose service is down would refuse; cutting
also drops every open connection. Stalled, it stops forwarding without closing anything:
connections stay open and new ones are accepted, but no byte gets through, as with a
frozen server or a network partition (the kernel still acknowledges what is sent, so only
a client's own deadline notices)."""

from __future__ import annotations

import socket
import threading
from urllib.parse import urlsplit

from .services import free_port


def through(url: str, proxy: Proxy) -> str:
    """``url`` with its host:port replaced by the proxy's."""
    parts = urlsplit(url)
    return parts._replace(netloc=parts.netloc.replace(
        f"{parts.hostname}:{parts.port}", f"127.0.0.1:{proxy.port}")).geturl()


class _Link:
    """One client connection and its upstream: forwarding while ``flowing`` is set,
    discarding everything once ``dead`` (a connection half-open for good)."""

    def __init__(self, flowing: bool) -> None:
        self.flowing = threading.Event()
        if flowing:
            self.flowing.set()
        self.dead = False


class Proxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self.down = threading.Event()
        self.stalled = threading.Event()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._links: set[_Link] = set()
        self._server = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True, name="proxy").start()

    def url(self, template: str) -> str:
        """``template`` with ``{port}`` replaced by the proxy's port."""
        return template.format(port=self.port)

    def cut(self) -> None:
        self.down.set()
        with self._lock:
            for sock in self._open:
                _close(sock)
            self._open.clear()

    def stall(self) -> None:
        """Stop forwarding, closing nothing (``restore`` lets it flow again)."""
        with self._lock:
            self.stalled.set()
            for link in self._links:
                link.flowing.clear()

    def restore(self, *, drop_stalled: bool = False) -> None:
        """Forward again. ``drop_stalled``: the connections that were stalled stay open
        but never carry another byte (half-open, as after a partition a peer never
        learnt of); only new ones forward."""
        with self._lock:
            self.down.clear()
            self.stalled.clear()
            for link in self._links:
                link.dead = link.dead or (drop_stalled and not link.flowing.is_set())
                link.flowing.set()

    def close(self) -> None:
        self.cut()
        self.restore()
        _close(self._server)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            if self.down.is_set():
                _close(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                _close(client)
                continue
            upstream.settimeout(None)
            with self._lock:
                link = _Link(flowing=not self.stalled.is_set())
                self._open.update((client, upstream))
                self._links.add(link)
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst, link),
                                 daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, link: _Link) -> None:
        try:
            while data := src.recv(65536):
                link.flowing.wait()
                if not link.dead:
                    dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._open.discard(src)
                self._open.discard(dst)
                self._links.discard(link)
            _close(src)
            _close(dst)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
