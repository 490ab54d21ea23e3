"""Fewer, larger socket reads for a response body of known length: the socket's receive low-water
mark (SO_RCVLOWAT), sized from the transfer's own rate.

A socket is readable as soon as any bytes land, so the loop wakes for whatever a server's last
write or the network's last burst brought: a median of 64 KiB per wake-up over 12 connections at
25 MB/s each (the benchmark's HTTP server). Every wake-up costs the loop thread aiohttp's parser
call, the re-arming of its read timeout, and a task step or more of ours, whatever its size. With
the mark at what arrives in WINDOW_S at the transfer's measured rate (at most the chunk size), the
kernel holds the wake-up until that much is there. Measured on the 2-core build machine, raw
passes over 16 shards over HTTP in fresh processes, median of 7 alternating runs each: process CPU
1.53 -> 1.33 s a pass, 2,201 -> 2,333 samples/s.

The mark must never hold back bytes the reader needs:

- It is at most the body bytes still to come from the socket (content length less what aiohttp
  was fed), less one TLS record on TLS (a record's plaintext is fed only when it is whole; without
  that slack asyncio's loop hung at a body's end). It is set again after every chunk the transfer
  reads, so a reader that keeps pulling never waits on it.
- A reader that stops pulling leaves the mark as it was while aiohttp reads on, and a server that
  slows down or stalls sends less than the mark: either way a timer drops the mark to 1 once
  QUIET_S pass without a byte (else the bytes would wait in the kernel, with aiohttp's read
  timeout running). The rate is then sampled afresh.
- The mark is 1 again in the call in which aiohttp gives the connection back to the pool (its
  body's EOF callbacks), before another request can take it: a later response's headers must wake
  the loop at once.

Linux only (elsewhere the mark's readiness rules differ); without a known length, with a
Content-Encoding, or without a socket (a test transport) the transfer reads as before. aiohttp
responses of the HTTP fetcher and of aiobotocore (S3) use it.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from typing import Any, Dict, Optional

__all__ = ["LowWater", "WINDOW_S", "QUIET_S"]

WINDOW_S = 0.01  # the bytes a wake-up may wait for: this long at the transfer's rate
QUIET_S = 0.05  # a transfer without a byte this long has its mark dropped to 1
SAMPLE_S = WINDOW_S / 2  # the shortest span a rate is measured over
MIN_MARK = 16 << 10  # a smaller batch saves too little to pay for its system calls
TLS_SLACK = (16 << 10) + 512  # a TLS record (plaintext and overhead) read but not yet fed
ENABLED = sys.platform.startswith("linux") and hasattr(socket, "SO_RCVLOWAT")


class LowWater:
    """One response body's low-water mark: `update()` after each chunk it yields, `close()` when
    it ends (in a `finally`). `for_response` returns None where the mark cannot be used safely.

    The rate is the last sample's: the bytes fed over at least SAMPLE_S, so that it follows a link
    that speeds up or slows down within a few batches (a cumulative mean would still count a stall
    long after it). A new transfer starts from the last rate seen from its origin.

    While the mark is above 1 a timer on the loop looks every QUIET_S whether bytes came (the
    watchdog): one timer per marked transfer, none for a transfer whose mark is 1, and no task
    shared between event loops."""

    __slots__ = ("sock", "length", "content", "slack", "cap", "origin", "loop", "mark", "rate", "at", "at_fed",
                 "seen", "timer")

    def __init__(self, sock: Any, length: int, content: Any, slack: int, cap: int, origin: Any = None) -> None:
        self.sock, self.length, self.content, self.slack, self.cap = sock, length, content, slack, cap
        self.origin = origin
        self.loop = asyncio.get_running_loop()
        self.mark = 1
        self.rate = _rates.get(origin, 0.0)  # bytes/s
        self.at, self.at_fed = time.monotonic(), content.total_bytes  # where the current sample began
        self.seen = 0  # bytes fed when the watchdog last looked
        self.timer: Optional[asyncio.TimerHandle] = None

    @classmethod
    def for_response(cls, resp: Any, cap: int) -> Optional["LowWater"]:
        """A mark for an aiohttp response whose body's length on the wire is known, else None
        (call on the response's loop)."""
        length = resp.content_length
        conn = resp.connection
        if not ENABLED or length is None or conn is None or conn.transport is None or cap < MIN_MARK:
            return None
        if resp.headers.get("Content-Encoding", "identity").lower() != "identity":
            return None  # aiohttp counts decoded bytes, the wire carries encoded ones
        transport = conn.transport
        sock = transport.get_extra_info("socket")
        if sock is None or getattr(sock, "type", None) != socket.SOCK_STREAM:
            return None
        slack = TLS_SLACK if transport.get_extra_info("ssl_object") is not None else 0
        mark = cls(sock, length, resp.content, slack, cap, (resp.url.host, resp.url.port))
        # At the body's end aiohttp gives the connection back to the pool, maybe before this
        # transfer's task runs again: the mark goes back to 1 in the same call.
        resp.content.on_eof(mark.close)
        return mark

    def update(self) -> None:
        """Set the mark for the next wake-up from the bytes fed so far (call after every chunk)."""
        fed = self.content.total_bytes
        now = time.monotonic()
        if now - self.at >= SAMPLE_S:
            self.rate = (fed - self.at_fed) / (now - self.at)
            self.at, self.at_fed = now, fed
        want = min(self.cap, self.length - fed - self.slack, int(self.rate * WINDOW_S))
        self._set(want if want >= MIN_MARK else 1)

    def close(self) -> None:
        if self.rate > 0:
            _rates[self.origin] = self.rate
        self._set(1)
        self.cap = 0  # (a late `update` leaves it at 1)

    def _look(self) -> None:
        """The watchdog: no byte since the last look, read what is there and sample the rate afresh."""
        self.timer = None
        if self.mark == 1:
            return
        fed = self.content.total_bytes
        if fed == self.seen:
            self._set(1)
            self.rate, self.at, self.at_fed = 0.0, time.monotonic(), fed
        else:
            self.seen = fed
            self.timer = self.loop.call_later(QUIET_S, self._look)

    def _set(self, mark: int) -> None:
        if mark == self.mark:
            return
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, mark)
        except (OSError, ValueError):  # the connection is gone (its fd too: ValueError); the read reports it
            self.cap, mark = 0, 1  # no mark again
        self.mark = mark
        if mark > 1 and self.timer is None:
            self.seen = self.content.total_bytes
            self.timer = self.loop.call_later(QUIET_S, self._look)
        elif mark == 1 and self.timer is not None:
            self.timer.cancel()
            self.timer = None


_rates: Dict[Any, float] = {}  # (host, port): the last rate a transfer from there measured
