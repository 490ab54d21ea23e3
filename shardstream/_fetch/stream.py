"""The bridge from the fetch loop to threads: `open_stream` starts one URL downloading on the
shared loop (`loop`) and hands its chunks to a consumer thread through a bounded buffer, so a
consumer opens the next shards ahead of time and several download while one is parsed.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import os
import threading
import time
from typing import Any, Optional

from .._base.cancel import Stopped, current_stop
from .._base.counters import Counters
from .._base.errors import FetchError
from .loop import exiting, get_loop, interpreter_exit, run_coroutine
from .options import FetchOptions, FetchStats, _stream_stats
from .parts import Demand, demand
from .registry import fetch_stream

__all__ = ["ChunkStream", "open_stream"]


# --- the bridge to consumer threads -------------------------------------------------------------

_END: Any = object()
_STOP_POLL_S = 0.1  # how often a wait for the network looks at its thread's stop event


class _Failure:
    __slots__ = ("exc", "at_exit")

    def __init__(self, exc: BaseException, at_exit: bool = False) -> None:
        self.exc, self.at_exit = exc, at_exit


def _cancelled(url: str) -> _Failure:
    """What the consumer of a stream whose pump ended without an outcome gets (`finish` keeps the
    pump's own outcome when it had one)."""
    if exiting():  # (what the reading thread gets is decided in it: see interpreter_exit)
        return _Failure(FetchError("fetch cancelled: the interpreter is exiting", url=url), at_exit=True)
    return _Failure(FetchError("fetch cancelled (event loop shut down)", url=url))


class _Buffer:
    """Chunks between the pump task (loop thread) and the consumer thread, bounded in bytes.

    The consumer blocks on a threading.Condition; the pump waits on an asyncio.Event that the
    consumer sets through call_soon_threadsafe, only when the pump actually waits (one wake-up
    per refill, not one per chunk). Holds no reference to the ChunkStream, so dropping the
    ChunkStream lets its finalizer cancel the pump.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int, stats: FetchStats, group: Any = None) -> None:
        self.loop, self.limit = loop, limit
        self.stats = stats  # the stream's: gets `wait_us`, how long the consumer waited for bytes
        self.cond = threading.Condition(threading.Lock())
        self.items: collections.deque = collections.deque()
        self.buffered = 0
        self.finished = False  # _END or a _Failure has been queued
        self.closed = False  # the consumer is gone: drop everything
        self.pump_waiting = False
        self.resume = asyncio.Event()
        self.task: Optional[asyncio.Task] = None
        self.demand = Demand(group)  # tells a parted download that its consumer waits (see parts)

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
        """Consumer side: the next chunk, _END or _Failure, waiting while there is none; raises
        `Stopped` once this thread's stop event (`current_stop`) is set while it waits."""
        stop = current_stop()
        started = 0.0
        with self.cond:
            if not self.items:
                started = time.perf_counter()
            while not self.items:
                if self.closed:  # closed by another thread while this one waited
                    return _END
                if not self.demand.waiting:
                    self.demand.waiting = True
                    self.loop.call_soon_threadsafe(self.demand.fire)
                if stop is None:
                    self.cond.wait()
                elif stop.is_set():
                    raise Stopped()
                else:
                    self.cond.wait(_STOP_POLL_S)
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
        if started:
            self.stats.add(wait_us=int((time.perf_counter() - started) * 1e6))
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

    Streams given the same `group` (any object) are read one after the other in the order they
    were opened, by one reader: their ranged parts download within one window of bytes ahead of
    that reader (see `parts`). Without a group, a stream is a reader of its own.

    Attributes: `url`, `options`, `stats` (this stream's FetchStats; its retries and resumes
    are also counted into `count_into`, when given: the counters of the stage that reads it).
    """

    def __init__(
        self, url: str, *, options: Optional[FetchOptions] = None, start: int = 0, group: Any = None,
        count_into: Optional[Counters] = None,
    ) -> None:
        if start < 0:
            raise ValueError(f"start must be >= 0, got {start}")
        self.url = url
        self.options = options or FetchOptions()
        self.stats = FetchStats(also=count_into)
        self._pid = os.getpid()
        self._loop = get_loop()
        self._buffer = _Buffer(self._loop, self.options.prefetch_bytes, self.stats, group)
        self._future = run_coroutine(_pump(url, self.options, start, self._buffer, self.stats))
        # A pump that never ran or was cancelled by loop shutdown must not leave a consumer
        # waiting forever. (No bound method here: the loop must not keep this object alive.)
        buffer = self._buffer
        self._future.add_done_callback(lambda _: buffer.finish(_cancelled(url)))

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
        if item.at_exit:
            raise interpreter_exit(str(item.exc)) from None
        raise item.exc

    def abandon(self) -> None:
        """Say that this stream will be closed unread: its parts get no more of the part budget
        (closing a pass closes its streams one by one, and the budget each one freed went to the
        parts of the next: requests sent only to be dropped)."""
        self._buffer.demand.abandoned = True

    def close(self, timeout: Optional[float] = 5.0) -> None:
        """Cancel the download (if still running) and wait up to `timeout` s for it to stop."""
        if os.getpid() != self._pid:
            return  # a forked child: the pump is the parent's, and a parent thread may hold the lock
        self.abandon()
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


def open_stream(
    url: str, *, options: Optional[FetchOptions] = None, start: int = 0, group: Any = None,
    count_into: Optional[Counters] = None,
) -> ChunkStream:
    """Start fetching `url` on the shared loop; iterate the returned ChunkStream for its bytes
    (`group`, `count_into`: see ChunkStream)."""
    return ChunkStream(url, options=options, start=start, group=group, count_into=count_into)
