"""Fetch options (retries, timeouts, chunk and part sizes) and the fetch counters: process-wide
and per stream (a stream's task sets its counters in its context; fetchers count into them)."""

from __future__ import annotations

import contextvars
import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from .._base.counters import Counters

__all__ = ["FetchOptions", "FetchStats", "fetch_stats", "note_fetch", "note_size"]


@dataclass(frozen=True)
class FetchOptions:
    """How bytes are fetched.

    Args:
        connect_timeout: seconds to open a connection.
        stall_timeout: seconds without a byte (before the headers or between chunks), or with
            under 64 KiB of a body (a server that drips bytes), or from an http(s) request to
            its last response header, after which a transfer counts as stalled: a FetchTimeout,
            retried and resumed.
        retries: retries after consecutive failed attempts (an attempt that delivers 64 KiB or
            the rest of the object starts the count again, so a long flaky download is not cut
            short; one that trickles in less does not, so a server that sends a byte per
            connection is given up on).
        backoff_base, backoff_max: retry delays are drawn uniformly from
            [0, min(backoff_max, backoff_base * 2 ** (failures - 1))] ("full jitter").
        chunk_size: the largest chunk handed on (a target: the network decides how much is there);
            over http(s) also what aiohttp buffers per connection (twice this) before it stops
            reading the socket: a part paused for memory (see `_fetch.parts.UNREAD_CAP`) holds
            no more. 64 KiB: at 256 KiB the paused connections held ~16 MB more (32 of them).
        prefetch_bytes: bytes an open stream buffers ahead of its consumer.
        parallel_parts: connections one http(s) URL may be fetched over at once (1: a single
            one). Above 1, and when the server tells the size (Range) and it is more than one
            part, the bytes are fetched as consecutive parts with parallel Range requests and
            handed on strictly in order: this gets past per-connection bandwidth caps. Which
            parts download is decided for the whole process (see `_fetch.parts`): the bytes each
            reader needs soonest first, within `part_budget` of its position. The first part's
            response tells the size (a stream opened behind one whose size is not known yet asks
            for one byte at once, to learn its own).
        part_size: bytes per part; None (the default) chooses from what the transfers show:
            2 x time to first byte x per-connection rate, no more than `part_budget` spread over
            `parallel_parts`, within 512 KiB-8 MiB (2 MiB to begin with).
        part_budget: bytes that parts not yet being read may hold, for the whole process (the
            largest value any stream asked for); also the most a reader's window may reach (how
            far ahead of its position parts download: sized to what the reader consumes, twice
            its bytes per part latency, doubling while it waits; a pass starts with 16 MiB, or
            with the window a pass last paused with, if that is larger). A stream's
            buffer (`prefetch_bytes`) is beyond the window.
    """

    connect_timeout: float = 10.0
    stall_timeout: float = 30.0
    retries: int = 8
    backoff_base: float = 0.2
    backoff_max: float = 10.0
    chunk_size: int = 64 << 10
    prefetch_bytes: int = 2 << 20
    parallel_parts: int = 32
    part_size: Optional[int] = None
    part_budget: int = 64 << 20

    def __post_init__(self) -> None:
        if not self.connect_timeout > 0 or not self.stall_timeout > 0:
            raise ValueError("connect_timeout and stall_timeout must be positive")
        if not isinstance(self.retries, int) or self.retries < 0:
            raise ValueError(f"retries must be an int >= 0, got {self.retries!r}")
        if not (self.backoff_base >= 0 and self.backoff_max >= 0):
            raise ValueError("backoff_base and backoff_max must be >= 0")
        if self.chunk_size < 1 or self.prefetch_bytes < 1:
            raise ValueError("chunk_size and prefetch_bytes must be >= 1")
        if not isinstance(self.parallel_parts, int) or self.parallel_parts < 1:
            raise ValueError(f"parallel_parts must be an int >= 1, got {self.parallel_parts!r}")
        if self.part_size is not None and (not isinstance(self.part_size, int) or self.part_size < 1):
            raise ValueError(f"part_size must be None or an int >= 1, got {self.part_size!r}")
        if not isinstance(self.part_budget, int) or self.part_budget < 0:
            raise ValueError(f"part_budget must be an int >= 0, got {self.part_budget!r}")

    def replace(self, **changes: Any) -> "FetchOptions":
        return dataclasses.replace(self, **changes)

class FetchStats(Counters):
    """Fetch counters: bytes delivered, retries, Range resumes, failed fetches; a stream's also
    records the object's size once a response said it, and `wait_us`: how long its reader waited
    for bytes that had not arrived (microseconds).

    `also` (a stream's: the counters of the source stage that opened it) gets this stream's
    retries and resumes too, so that a pipeline's stats count its own, not the process's."""

    FIELDS = ("bytes", "retries", "resumes", "failures")
    FORWARDED = ("retries", "resumes", "wait_us")

    def __init__(self, also: Optional[Counters] = None) -> None:
        super().__init__()
        self.size: Optional[int] = None
        self.also = also

    def add(self, **counts: int) -> None:
        super().add(**counts)
        if self.also is not None:
            forwarded = {field: n for field, n in counts.items() if field in self.FORWARDED}
            if forwarded:
                self.also.add(**forwarded)

_GLOBAL_STATS = FetchStats()
# The stats of the stream whose task is running; each stream's task has its own context.
_stream_stats: contextvars.ContextVar[Optional[FetchStats]] = contextvars.ContextVar("stream_stats", default=None)

def fetch_stats() -> FetchStats:
    """The process-wide fetch counters."""
    return _GLOBAL_STATS

def note_size(size: int) -> None:
    """A fetcher learnt the size of the object the current stream reads (see `ChunkStream.size`)."""
    stats = _stream_stats.get()
    if stats is not None:
        stats.size = size

def note_fetch(**counts: int) -> None:
    """Count fetch events (bytes=, retries=, resumes=, failures=) globally and for the current
    stream. Fetchers call it for retries and resumes; `fetch_stream` counts bytes and failures."""
    _GLOBAL_STATS.add(**counts)
    stats = _stream_stats.get()
    if stats is not None:
        stats.add(**counts)

