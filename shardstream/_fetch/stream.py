"""The fetch layer: the bytes of a URL as an async stream, and a bridge to threads.

`fetch_stream` dispatches on the URL scheme: http(s) to `_http`, s3 to `_s3`, schemes added with
`register_fetcher`, and everything else (paths, file:, pipe:, other fsspec protocols) to the
blocking opener in `_open`, run in worker threads. `open_stream` starts one URL downloading on the
shared loop (`_loop`) and hands its chunks to a consumer thread through a bounded buffer, so a
consumer opens the next shards ahead of time and several download while one is parsed.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextvars
import dataclasses
import importlib
import os
import threading
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Dict, Optional, Union

from .._base.counters import Counters
from .._base.errors import FetchError, ShardStreamError, UsageError
from .loop import get_loop, run_coroutine
from .open import open_url
from .parts import Demand, demand, parallel_stream

__all__ = [
    "ChunkStream",
    "FetchOptions",
    "FetchStats",
    "fetch_stats",
    "fetch_stream",
    "fetches_natively",
    "note_fetch",
    "note_size",
    "open_stream",
    "register_fetcher",
]

Fetcher = Callable[..., AsyncIterator[bytes]]  # (url, *, options, start=0) -> chunks


@dataclass(frozen=True)
class FetchOptions:
    """How bytes are fetched.

    Args:
        connect_timeout: seconds to open a connection.
        stall_timeout: seconds without a byte (before the headers or between chunks) after which
            a transfer counts as stalled: a FetchTimeout, retried and resumed.
        retries: retries after consecutive failed attempts (an attempt that delivers new bytes
            starts the count again, so a long flaky download is not cut short).
        backoff_base, backoff_max: retry delays are drawn uniformly from
            [0, min(backoff_max, backoff_base * 2 ** (failures - 1))] ("full jitter").
        chunk_size: the largest chunk handed on (a target: the network decides how much is there).
        prefetch_bytes: bytes an open stream buffers ahead of its consumer.
        parallel_parts: connections one http(s) URL may be fetched over at once (1: a single
            one). Above 1, and when the server tells the size (Range) and it is more than one
            part, the bytes are fetched as consecutive parts with parallel Range requests and
            handed on strictly in order: this gets past per-connection bandwidth caps. Which
            parts download is decided for the whole process (see `_parts`): the bytes readers
            need soonest first, within `part_budget`. Costs one extra request per URL (its size).
        part_size: bytes per part; None (the default) chooses from what the transfers show:
            2 x time to first byte x per-connection rate, within 1-8 MiB (2 MiB to begin with).
        part_budget: bytes that parts not yet being read may hold, for the whole process (the
            largest value any stream asked for).
    """

    connect_timeout: float = 10.0
    stall_timeout: float = 30.0
    retries: int = 8
    backoff_base: float = 0.2
    backoff_max: float = 10.0
    chunk_size: int = 256 << 10
    prefetch_bytes: int = 2 << 20
    parallel_parts: int = 16
    part_size: Optional[int] = None
    part_budget: int = 96 << 20

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
    records the object's size once a response said it."""

    FIELDS = ("bytes", "retries", "resumes", "failures")

    def __init__(self) -> None:
        super().__init__()
        self.size: Optional[int] = None


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


# --- the scheme registry ------------------------------------------------------------------------

# Built-in fetchers are "module:function" strings, imported on first use: aiohttp and the S3
# client are optional, and a missing one must fail only for the URLs that need it.
_fetchers: Dict[str, Union[str, Fetcher]] = {
    "http": ".http:http_stream",
    "https": ".http:http_stream",
    "s3": ".s3:s3_stream",
}
# Fetchers that can fetch in parallel parts (see _parts.parallel_stream for the contract).
_PARTED = {".http:http_stream"}
_registry_lock = threading.Lock()


def register_fetcher(scheme: str, fetcher: Optional[Fetcher]) -> Optional[Union[str, Fetcher]]:
    """Route `scheme://` URLs to `fetcher(url, *, options, start=0)`, an async iterator of bytes
    (None removes the route); return the previous entry."""
    if not scheme or not scheme.replace("+", "").replace("-", "").replace(".", "").isalnum():
        raise ValueError(f"invalid URL scheme {scheme!r}")
    with _registry_lock:
        previous = _fetchers.pop(scheme.lower(), None)
        if fetcher is not None:
            _fetchers[scheme.lower()] = fetcher
        return previous


def fetches_natively(url: str) -> bool:
    """Whether `url`'s scheme has a fetcher in the registry (http, https, s3 and every scheme
    added with `register_fetcher`): such URLs stream through the async fetchers; the rest
    (paths, file:, pipe:, other fsspec protocols) through the blocking opener."""
    return _entry_for(url) is not None


def _entry_for(url: str) -> Optional[Union[str, Fetcher]]:
    scheme, sep, _ = url.partition("://")
    return _fetchers.get(scheme.lower()) if sep else None


def _resolve(entry: str, url: str) -> Any:
    module_name, _, name = entry.partition(":")
    try:
        return getattr(importlib.import_module(module_name, __package__), name)
    except ImportError as exc:
        scheme = url.partition("://")[0]
        raise UsageError(f"{scheme}:// URLs need an optional dependency: {exc}", url=url) from exc


def _fetcher_for(url: str) -> Fetcher:
    entry = _entry_for(url)
    if entry is None:
        return _blocking_stream
    if isinstance(entry, str):
        return _resolve(entry, url)
    return entry


def _chunks_for(url: str, options: FetchOptions, start: int) -> AsyncIterator[bytes]:
    if options.parallel_parts > 1:
        entry = _entry_for(url)
        if isinstance(entry, str) and entry in _PARTED:
            return parallel_stream(url, options, start, _resolve(entry, url))
    return _fetcher_for(url)(url, options=options, start=start)


async def fetch_stream(url: str, *, options: Optional[FetchOptions] = None, start: int = 0) -> AsyncIterator[bytes]:
    """Yield the bytes of `url` from byte `start` on, in chunks, retrying as `options` say.

    Raises:
        ShardNotFound: nothing at the URL (never retried).
        FetchError (FetchTimeout, NetworkError): the bytes could not be fetched; the message
            names the URL (credentials redacted) and the offset reached.
        UsageError: the URL needs something not enabled or installed (pipe:, aiohttp, s3).
    """
    options = options or FetchOptions()
    if start < 0:
        raise ValueError(f"start must be >= 0, got {start}")
    offset = start
    try:
        chunks = _chunks_for(url, options, start)
        try:
            async for chunk in chunks:
                offset += len(chunk)
                note_fetch(bytes=len(chunk))
                yield chunk
        finally:
            await chunks.aclose()  # `async for` does not close it when we are closed or cancelled
    except ShardStreamError:
        note_fetch(failures=1)
        raise
    except Exception as exc:  # a third-party fetcher's own error: keep the tree's promise
        note_fetch(failures=1)
        raise FetchError(f"fetch failed: {type(exc).__name__}: {exc}", url=url, offset=offset) from exc


class _BlockingReader:
    """A blocking source (file, pipe, fsspec) read in worker threads, one call at a time."""

    def __init__(self, url: str, chunk_size: int, start: int) -> None:
        self.url, self.chunk_size, self.start = url, chunk_size, start
        self.file: Any = None
        self.offset = 0

    def read(self) -> bytes:
        if self.file is None:
            self.file = open_url(self.url)
            self._skip_to_start()
        try:
            chunk = self.file.read(self.chunk_size)
        except OSError as exc:
            raise FetchError(f"read failed: {exc}", url=self.url, offset=self.offset) from exc
        self.offset += len(chunk)
        return chunk

    def _skip_to_start(self) -> None:
        seekable = getattr(self.file, "seekable", None)
        if self.start and seekable is not None and seekable():
            self.offset = self.file.seek(self.start)
            return
        while self.offset < self.start:  # pipes: read and drop the prefix
            chunk = self.file.read(min(self.chunk_size, self.start - self.offset))
            if not chunk:
                break
            self.offset += len(chunk)

    def close(self) -> None:
        if self.file is not None and self.url != "-":
            self.file.close()


async def _blocking_stream(url: str, *, options: FetchOptions, start: int = 0) -> AsyncIterator[bytes]:
    """Local files, pipe: and other fsspec URLs, read in the loop's default executor."""
    loop = asyncio.get_running_loop()
    reader = _BlockingReader(url, options.chunk_size, start)
    pending: Optional[asyncio.Future] = None
    try:
        while True:
            pending = loop.run_in_executor(None, reader.read)
            chunk = await asyncio.shield(pending)
            if not chunk:
                return
            yield chunk
    finally:
        if pending is not None and not pending.done():
            # Cancelled mid-read: the worker still uses the file; close it only once it is done.
            await asyncio.wait({pending})
        await loop.run_in_executor(None, reader.close)


# --- the bridge to consumer threads -------------------------------------------------------------

_END: Any = object()


class _Failure:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class _Buffer:
    """Chunks between the pump task (loop thread) and the consumer thread, bounded in bytes.

    The consumer blocks on a threading.Condition; the pump waits on an asyncio.Event that the
    consumer sets through call_soon_threadsafe, only when the pump actually waits (one wake-up
    per refill, not one per chunk). Holds no reference to the ChunkStream, so dropping the
    ChunkStream lets its finalizer cancel the pump.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int) -> None:
        self.loop, self.limit = loop, limit
        self.cond = threading.Condition(threading.Lock())
        self.items: collections.deque = collections.deque()
        self.buffered = 0
        self.finished = False  # _END or a _Failure has been queued
        self.closed = False  # the consumer is gone: drop everything
        self.pump_waiting = False
        self.resume = asyncio.Event()
        self.task: Optional[asyncio.Task] = None
        self.demand = Demand()  # tells a parted download that its consumer waits (see _parts)

    def put(self, chunk: bytes) -> bool:
        """Loop side: queue a chunk; True if the pump must now wait for `resume`."""
        with self.cond:
            if self.closed:
                return False
            self.items.append(chunk)
            self.buffered += len(chunk)
            self.cond.notify()
            if self.buffered >= self.limit:
                self.resume.clear()
                self.pump_waiting = True
            return self.pump_waiting

    def finish(self, item: Any) -> None:
        """Queue the end of the stream (_END or a _Failure); only the first one counts."""
        with self.cond:
            if not self.finished:
                self.finished = True
                self.items.append(item)
                self.cond.notify_all()

    def get(self) -> Any:
        """Consumer side: the next chunk, _END or _Failure, waiting while there is none."""
        with self.cond:
            while not self.items:
                if self.closed:  # closed by another thread while this one waited
                    return _END
                if not self.demand.waiting:
                    self.demand.waiting = True
                    self.loop.call_soon_threadsafe(self.demand.fire)
                self.cond.wait()
            self.demand.waiting = False
            item = self.items[0]
            if item.__class__ is not bytes:
                return item  # left in place: every later call sees the end again
            self.items.popleft()
            self.buffered -= len(item)
            wake = self.pump_waiting and self.buffered < self.limit
            if wake:
                self.pump_waiting = False
        if wake:
            self.loop.call_soon_threadsafe(self.resume.set)
        return item

    def cancel_on_loop(self) -> None:
        if self.task is not None:
            self.task.cancel()


async def _pump(url: str, options: FetchOptions, start: int, buffer: _Buffer, stats: FetchStats) -> None:
    buffer.task = asyncio.current_task()
    if buffer.closed:
        return
    _stream_stats.set(stats)  # this task's context only
    demand.set(buffer.demand)
    chunks = fetch_stream(url, options=options, start=start)
    try:
        async for chunk in chunks:
            if buffer.put(chunk):
                await buffer.resume.wait()
            if buffer.closed:
                return
        buffer.finish(_END)
    except Exception as exc:  # shipped to the consumer thread, re-raised there
        buffer.finish(_Failure(exc))
    finally:
        await chunks.aclose()


class ChunkStream:
    """The bytes of one URL, downloading on the shared loop; iterate it from any thread.

    It starts fetching when created and stays at most about `options.prefetch_bytes` (plus one
    chunk) ahead of the consumer. Errors of the fetch are raised by `__next__`. `close()` (also
    on garbage collection and `with` exit) cancels the download and releases its connection.

    Attributes: `url`, `options`, `stats` (this stream's FetchStats).
    """

    def __init__(self, url: str, *, options: Optional[FetchOptions] = None, start: int = 0) -> None:
        if start < 0:
            raise ValueError(f"start must be >= 0, got {start}")
        self.url = url
        self.options = options or FetchOptions()
        self.stats = FetchStats()
        self._pid = os.getpid()
        self._loop = get_loop()
        self._buffer = _Buffer(self._loop, self.options.prefetch_bytes)
        self._future = run_coroutine(_pump(url, self.options, start, self._buffer, self.stats))
        # A pump that never ran or was cancelled by loop shutdown must not leave a consumer
        # waiting forever. (No bound method here: the loop must not keep this object alive.)
        failure = _Failure(FetchError("fetch cancelled (event loop shut down)", url=url))
        buffer = self._buffer
        self._future.add_done_callback(lambda _: buffer.finish(failure))

    @property
    def size(self) -> Optional[int]:
        """The object's size in bytes once the server has said it (else None): lets a reader
        refuse a member that claims more bytes than the object has, without buffering it."""
        return self.stats.size

    @property
    def buffered_bytes(self) -> int:
        """Bytes fetched and not yet taken by the consumer."""
        return self._buffer.buffered

    @property
    def closed(self) -> bool:
        return self._buffer.closed

    @property
    def downloading(self) -> bool:
        """True while the fetch is still running (not finished, failed or cancelled)."""
        return not self._future.done()

    def __iter__(self) -> "ChunkStream":
        return self

    def __next__(self) -> bytes:
        if self._buffer.closed:
            raise StopIteration
        if os.getpid() != self._pid:
            raise FetchError("a stream opened before fork cannot be read in the child", url=self.url)
        item = self._buffer.get()
        if item.__class__ is bytes:
            return item
        if item is _END:
            raise StopIteration
        raise item.exc

    def close(self, timeout: Optional[float] = 5.0) -> None:
        """Cancel the download (if still running) and wait up to `timeout` s for it to stop."""
        if os.getpid() != self._pid:
            return  # a forked child: the pump is the parent's, and a parent thread may hold the lock
        buffer = self._buffer
        with buffer.cond:
            if buffer.closed:
                return
            buffer.closed = True
            buffer.items.clear()
            buffer.buffered = 0
            buffer.cond.notify_all()
        if self._future.done():
            return
        try:
            self._loop.call_soon_threadsafe(buffer.cancel_on_loop)
        except RuntimeError:  # the loop is closed (interpreter exit): nothing runs any more
            return
        if timeout and not _running_on(self._loop):  # waiting on the loop thread would deadlock
            concurrent.futures.wait([self._future], timeout)

    def __enter__(self) -> "ChunkStream":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close(timeout=0)
        except Exception:  # noqa: BLE001 - finalizers must not raise
            pass


def _running_on(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def open_stream(url: str, *, options: Optional[FetchOptions] = None, start: int = 0) -> ChunkStream:
    """Start fetching `url` on the shared loop; iterate the returned ChunkStream for its bytes."""
    return ChunkStream(url, options=options, start=start)
