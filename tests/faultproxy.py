"""A TCP proxy in front of an HTTP/1.1 server (moto_server) that cuts response bodies short.

It replaces an in-process hook: the S3 client under test talks to the proxy over a real socket
and sees a real connection that ends early. `breaks` holds, for each of the next object GETs
(GET requests without a query string: S3's GetObject), the body bytes after which the proxy
stops forwarding and closes both connections (a graceful close, so every byte sent before the
cut arrives); `drip`, when set to (n, seconds), sends object bodies n bytes at a time, a pause
between (a server that never falls silent, yet never gets anywhere). Other requests (HEAD, listings, PUTs) pass through whole. Everything stays on
127.0.0.1; every thread is a daemon that ends with its sockets; `close()` stops it all.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import deque
from typing import Deque, List, Optional, Tuple
from urllib.parse import urlparse

_READ = 64 * 1024


def _read_head(sock: socket.socket, pending: bytearray) -> Optional[bytes]:
    """Read from `sock` until `pending` holds a whole head (up to CRLFCRLF); return it, or None at EOF."""
    while b"\r\n\r\n" not in pending:
        data = sock.recv(_READ)
        if not data:
            return None
        pending += data
    end = pending.index(b"\r\n\r\n") + 4
    head = bytes(pending[:end])
    del pending[:end]
    return head


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return 0


class FaultProxy:
    """Listen on 127.0.0.1 (a free port), forward to `target` ("http://host:port")."""

    def __init__(self, target: str) -> None:
        parsed = urlparse(target)
        self.target: Tuple[str, int] = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self.breaks: List[int] = []  # body bytes before the cut, for each next object GET
        self.cuts = 0
        self.drip: Optional[Tuple[int, float]] = None
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.2)
        self._sockets: List[socket.socket] = []
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="faultproxy", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.getsockname()[1]}"

    def _next_break(self) -> Optional[int]:
        with self._lock:
            return self.breaks.pop(0) if self.breaks else None

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:  # timeout, or closed
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:  # the target is gone: drop this client, keep accepting
                client.close()
                continue
            with self._lock:
                self._sockets += [client, upstream]
            requests: Deque[Tuple[str, str]] = deque()
            ready = threading.Condition()
            threading.Thread(target=self._requests, args=(client, upstream, requests, ready), daemon=True).start()
            threading.Thread(target=self._responses, args=(client, upstream, requests, ready), daemon=True).start()

    def _requests(self, client: socket.socket, upstream: socket.socket, requests: Deque, ready: threading.Condition) -> None:
        pending = bytearray()
        try:
            while True:
                head = _read_head(client, pending)
                if head is None:
                    break
                method, target = head.split(b" ", 2)[:2]
                with ready:
                    requests.append((method.decode(), target.decode()))
                    ready.notify()
                body = _content_length(head)
                upstream.sendall(head)
                while body:
                    if not pending:
                        data = client.recv(_READ)
                        if not data:
                            return
                        pending += data
                    part = bytes(pending[:body])
                    del pending[: len(part)]
                    upstream.sendall(part)
                    body -= len(part)
        except OSError:
            pass
        finally:
            self._close_pair(client, upstream)

    def _responses(self, client: socket.socket, upstream: socket.socket, requests: Deque, ready: threading.Condition) -> None:
        pending = bytearray()
        try:
            while True:
                head = _read_head(upstream, pending)
                if head is None:
                    break
                with ready:
                    ready.wait_for(lambda: bool(requests) or self._closed.is_set(), timeout=10)
                    method, target = requests.popleft() if requests else ("GET", "?")
                status = int(head.split(b" ", 2)[1])
                body = 0 if method == "HEAD" or status in (204, 304) else _content_length(head)
                cut = self._next_break() if method == "GET" and "?" not in target and status < 300 else None
                client.sendall(head)
                sent = 0
                while sent < body:
                    if not pending:
                        data = upstream.recv(_READ)
                        if not data:
                            return
                        pending += data
                    part = bytes(pending[: body - sent])
                    if cut is not None and sent + len(part) >= cut:
                        client.sendall(part[: cut - sent])
                        with self._lock:
                            self.cuts += 1
                        return  # the finally closes both sides: the body ends early
                    del pending[: len(part)]
                    self._send(client, part, self.drip if method == "GET" and "?" not in target else None)
                    sent += len(part)
        except OSError:
            pass
        finally:
            self._close_pair(client, upstream)

    def _send(self, client: socket.socket, data: bytes, drip: Optional[Tuple[int, float]]) -> None:
        if drip is None:
            client.sendall(data)
            return
        step, pause = drip
        for at in range(0, len(data), step):
            if self._closed.is_set():
                raise OSError("proxy closed")
            client.sendall(data[at : at + step])
            time.sleep(pause)

    def _close_pair(self, *sockets: socket.socket) -> None:
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def close(self) -> None:
        self._closed.set()
        self._server.close()
        self._thread.join(5)
        with self._lock:
            sockets, self._sockets = self._sockets, []
        self._close_pair(*sockets)
