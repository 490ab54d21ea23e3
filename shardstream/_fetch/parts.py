"""Many URLs as ranged parts on many connections, handed on in order, within one window of bytes.

A server that caps each connection (object stores, CDNs: ~25-100 MB/s each) is only fast over
many connections. A reader, though, consumes shards one after the other, in order. So every
stream is cut into parts (Range requests), and one process-wide `PartBudget` decides which parts
download: the ones the reader needs soonest first (streams in the order they were opened, parts
in byte order). A part is granted only when it lies within its reader's window (at most `budget`
bytes, see below) of the reader's position, counting the rest of every stream that reader reads
before it (a stream opened ahead waits until the streams before it have said their size and the
reader is near its start; one opened while a size before it is unknown asks for one byte at once
to learn its own), and while the bytes granted to all readers fit in `budget`. So what the
budget holds is always the bytes each reader needs next: never the heads of shards opened far
ahead while the shard being read waits for connections. The part at the front of each stream
(the next bytes its reader wants) never waits for the budget and is not counted in it, so the
reader always makes progress; memory stays within budget plus one front part per stream being
read.

Which front is free is decided by demand, not position: a stream's front part waits for the
budget like any other until the stream's consumer blocks on it (`Demand`, signalled by the
consumer thread). Streams iterated without a `Demand` (direct async use) have their fronts free.
A reader is a `Demand.group` (the loader gives each pass over a shard list its own); streams
without one are each a reader of their own.

Each reader's window is sized to what it consumes (`_Reader`): twice the bytes it consumes in
one part latency (grant to last byte), doubling whenever it waits for a part not granted yet or
granted late, within `budget`. A reader that decodes at 90 MB/s behind 140 ms needs ~25 MB ahead,
not the whole budget: parts waiting in memory for a slow reader only cost memory (on the
benchmark's server, a decode pass over HTTP added 79-85 MB of PSS with it against 117 MB with
the window at the budget; the fastest pipelines, whose window reaches the budget within ~0.3 s,
lost 4-12% of their first pass to that ramp in paired runs; starting at 32 MiB won most of that
back but the decode pass doubled to the budget early and added 113-115 MB again).

The part size adapts to what the transfers show and to the budget. Transfers are measured per
origin (scheme, host and port, `tuning_for`): a pipeline that reads a nearby server and a distant
store sizes each one's parts from that origin's times, and its reader's window is measured against
the latency of the origin of the stream it is reading. With `budget` bytes granted,
throughput is about budget / (time-to-first-byte + part / per-connection rate) while the
connections allowed (`parallel_parts`) can hold the budget: small parts win, until each spends
most of its time waiting for its first byte. So a part is the smaller of the budget spread over
`parallel_parts` connections and `2 x time-to-first-byte x per-connection rate` (two thirds of a
connection's time moving bytes, measured on finished parts), between `MIN_PART` and `MAX_PART`.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import dataclasses
import functools
import itertools
import math
import operator
import os
import time
import urllib.parse
from typing import Any, AsyncGenerator, Callable, Dict, List, Optional, Tuple

from .._base.errors import FetchError
from .options import fetch_stats

__all__ = ["Demand", "PartBudget", "demand", "origin_of", "parallel_stream", "part_budget", "tuning_for"]

MIN_PART = 512 << 10  # smaller parts cost more requests than they save in memory
MAX_PART = 8 << 20
DEFAULT_PART = 2 << 20  # before any transfer has finished
START_WINDOW = 16 << 20  # a reader's window before its rate is measured (it grows within ~3 latencies)
MIN_WINDOW = 4 << 20  # (and at least two parts)
DEFAULT_LATENCY = 0.1  # seconds from a part's grant to its last byte, before any part has finished
MIN_INTERVAL = 0.05  # a reader's rate is measured over at least this long
NARROWING = 1.0  # seconds: a window narrows by at most exp(-t / NARROWING)
IDLE_READER = 60.0  # seconds a reader with no open stream keeps its window (a pass between shards)
# Bytes that parts not being waited for may hold received and not yet read, in the whole process.
# Past it they stop reading their connections until the readers take some (the server then waits
# on TCP's flow control): the budget keeps its requests in flight, to cover the time to first
# byte, but not all their bytes in this process's heap. A part its reader waits for (promoted)
# never pauses, so the reader always makes progress. http-first (benchmarks, 4 alternating fresh
# processes): the pass added 79 MB of PSS without it, 62 with it, 49 with it and 64 KiB chunks
# (FetchOptions.chunk_size), at the same speed and CPU per sample.
UNREAD_CAP = 16 << 20
GRANT_AFTER_CLOSE_S = 0.05  # what a stream closed part way frees is granted this much later (see _grant_soon)
_stream_order = itertools.count()  # streams are opened in the order they will be read


class Demand:
    """Whether a stream's consumer is blocked waiting for its next bytes. The consumer thread
    sets `waiting` and asks the loop to call `fire`; the stream registers `callback`.

    `group` names the reader the stream belongs to (streams of one group are read one after the
    other, in the order they were opened); None: a group of its own."""

    __slots__ = ("waiting", "callback", "group", "abandoned")

    def __init__(self, group: Any = None) -> None:
        self.waiting = False
        self.callback: Optional[Callable[[], None]] = None
        self.group = group
        self.abandoned = False  # its consumer closes it unread: its parts get no more budget

    def fire(self) -> None:
        if self.waiting and self.callback is not None:
            self.callback()


demand: contextvars.ContextVar[Optional[Demand]] = contextvars.ContextVar("shardstream_demand", default=None)


class _Tuning:
    """Moving averages over one origin's finished parts: time to first byte, per-connection rate,
    and latency (from the grant to the last byte: how long ahead of its reader a part must start)."""

    def __init__(self) -> None:
        self.ttfb: Optional[float] = None
        self.rate: Optional[float] = None
        self.latency: Optional[float] = None

    def record(self, ttfb: float, nbytes: int, seconds: float, latency: Optional[float] = None) -> None:
        if nbytes < 64 << 10 or seconds <= 0:
            return  # too small to say anything about the rate
        rate = nbytes / seconds
        self.ttfb = ttfb if self.ttfb is None else 0.8 * self.ttfb + 0.2 * ttfb
        self.rate = rate if self.rate is None else 0.8 * self.rate + 0.2 * rate
        if latency is not None:
            self.latency = latency if self.latency is None else 0.8 * self.latency + 0.2 * latency

    def part_size(self, default: int, budget: Optional[int] = None, connections: int = 1) -> int:
        size = default if self.ttfb is None or self.rate is None else 2 * self.ttfb * self.rate
        if budget is not None:
            size = min(size, budget / max(1, connections))
        return int(min(MAX_PART, max(MIN_PART, size)))

    @property
    def latency_or_default(self) -> float:
        return self.latency if self.latency is not None else DEFAULT_LATENCY


# One per origin (scheme, host and port): a pipeline that mixes a nearby server and a distant store must
# not size the one's parts and windows from the other's times. The least recently used go first.
_tunings: "collections.OrderedDict[str, _Tuning]" = collections.OrderedDict()
MAX_ORIGINS = 256


def origin_of(url: str) -> str:
    """Where `url`'s bytes come from, as the tuning tells origins apart: its scheme, host and port
    (an S3 URL's bucket), never its credentials, path or query."""
    split = urllib.parse.urlsplit(url)
    try:
        port = f":{split.port}" if split.port is not None else ""
    except ValueError:  # (not a number: the fetch itself will say so)
        port = ""
    return f"{split.scheme.lower()}://{split.hostname or ''}{port}"


def tuning_for(url: str) -> _Tuning:
    """The measurements of `url`'s origin (fresh ones for an origin not seen yet)."""
    origin = origin_of(url)
    tuning = _tunings.get(origin)
    if tuning is None:
        tuning = _tunings[origin] = _Tuning()
        while len(_tunings) > MAX_ORIGINS:
            _tunings.popitem(last=False)
    else:
        _tunings.move_to_end(origin)
    return tuning


class _Reading:
    """One stream as its reader's window sees it: where its parts start being handed on
    (`read_to`), its size once a response said it (None before), and its origin's `tuning`."""

    __slots__ = ("group", "size", "read_to", "tuning", "demand")

    def __init__(self, group: Any, start: int, tuning: Optional[_Tuning] = None) -> None:
        self.demand: Optional[Demand] = None  # its consumer's (see Demand.abandoned)
        self.group = group
        self.size: Optional[int] = None
        self.read_to = start
        self.tuning = tuning if tuning is not None else _Tuning()

    @property
    def reader(self) -> Any:
        """The key of its reader's streams: the group, or the stream itself when it has none."""
        return self if self.group is None else self.group

    @property
    def remaining(self) -> Optional[int]:
        return None if self.size is None else max(0, self.size - self.read_to)


class _Reader:
    """One reader's open streams, in reading order, and its window: how many bytes ahead of its
    position parts may download.

    The window follows what the reader consumes, as TCP's receive-buffer autotuning does: once per
    part latency (grant to last byte) it is set to twice the bytes the reader consumed per latency,
    within `floor` and the budget (consumed: handed on from the stream being read into its buffer).
    It doubles, at most once per latency, whenever the reader waits for a part not granted yet or
    granted late (a fast reader reaches the budget within a few latencies), and it narrows by at
    most half in ~0.7 s (a lull, a burst). So a reader that consumes slowly (decoding, a training
    step) keeps a small window, and its parts arrive about when it needs them instead of waiting in
    memory."""

    __slots__ = ("streams", "window", "floor", "mark_time", "since_mark", "widened", "idle_since")

    def __init__(self, window: int, floor: int) -> None:
        self.streams: List[_Reading] = []
        self.window = window
        self.floor = floor
        self.mark_time: Optional[float] = None  # when the rate was last measured; None until the first bytes
        self.since_mark = 0  # bytes consumed since then
        self.widened = 0.0  # when the window last doubled
        self.idle_since: Optional[float] = None

    def consume(self, nbytes: int, limit: int, now: float, latency: float) -> None:
        """The reader handed on `nbytes` more (from an origin whose parts take `latency`): measure
        its rate once per latency, and resize."""
        if self.mark_time is None:  # (the time before the first bytes arrived says nothing of the reader)
            self.mark_time = now
            return
        self.since_mark += nbytes
        elapsed = now - self.mark_time
        if elapsed < max(latency, MIN_INTERVAL):
            return
        wanted = 2 * latency * self.since_mark / elapsed
        window = max(wanted, self.window * math.exp(-elapsed / NARROWING))
        self.window = int(min(limit, max(self.floor, window)))
        self.mark_time, self.since_mark = now, 0

    def starve(self, limit: int, now: float, latency: float) -> bool:
        """The reader waits for bytes still downloading (from an origin whose parts take
        `latency`): double the window (once per latency). True if it changed."""
        if self.mark_time is None or now - self.widened < latency or self.window >= limit:
            return False
        self.window = min(limit, 2 * self.window)
        self.widened = now
        return True


class PartBudget:
    """Bytes that parts behind the front of their stream may hold, granted in reading order.

    A waiting part is granted when it lies within its reader's window (at most `limit` bytes) of the
    reader's position (see the module's docstring) and, strict priority, when every part that will
    be read before it and is not held back by its own reader's window has been granted, within
    `limit` bytes in all. Parts promoted to the front of their stream are granted at once and hold
    nothing. Runs on the event loop (not thread-safe: every caller is a coroutine on the same loop).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._waiting: List[list] = []  # [key, bytes, future, part], granted ones dropped
        self._readers: Dict[Any, _Reader] = {}  # by reader key: its open streams and its window
        self._start = START_WINDOW  # a new reader's window: where the last pass (a grouped reader) paused
        self._soon: Optional[asyncio.TimerHandle] = None  # a grant put off (see _grant_soon), on this loop:
        self._soon_loop: Optional[asyncio.AbstractEventLoop] = None
        self.unread = 0  # bytes parts have received and their streams have not handed on
        self._paused: List["_Part"] = []  # parts waiting for unread bytes to fall below UNREAD_CAP

    def taken(self, nbytes: int) -> None:
        """A stream handed on (or dropped) `nbytes` a part had received: paused parts may go on,
        in reading order."""
        self.unread -= nbytes
        if self._paused and self.unread < UNREAD_CAP:
            self._resume()

    def _resume(self) -> None:
        paused, self._paused = sorted(self._paused, key=operator.attrgetter("key")), []
        for part in paused:
            if part.room is not None and not part.room.done():
                part.room.set_result(None)

    async def room(self, part: "_Part") -> None:
        """Wait, unless `part` is promoted, while parts hold UNREAD_CAP bytes received and unread."""
        while self.unread >= UNREAD_CAP and not part.promoted:
            part.room = asyncio.get_running_loop().create_future()
            self._paused.append(part)
            try:
                await part.room
            finally:
                part.room = None

    def open(self, group: Any, start: int, part_size: int = DEFAULT_PART, tuning: Optional[_Tuning] = None) -> _Reading:
        """Register a stream of reader `group` (None: a reader of its own), read after the ones
        before, in parts of about `part_size`, from an origin measured by `tuning`."""
        now = time.perf_counter()
        idle = [key for key, reader in self._readers.items()
                if reader.idle_since is not None and now - reader.idle_since > IDLE_READER]
        for key in idle:
            del self._readers[key]
        reading = _Reading(group, start, tuning)
        floor = max(MIN_WINDOW, 2 * part_size)
        reader = self._readers.get(reading.reader)
        if reader is None:
            reader = self._readers[reading.reader] = _Reader(max(self._start, floor), floor)
        reader.floor = max(reader.floor, floor)
        reader.window = max(reader.window, reader.floor)
        reader.idle_since = None
        reader.streams.append(reading)
        return reading

    def close(self, reading: _Reading, at_once: bool = True) -> None:
        reader = self._readers.get(reading.reader)
        if reader is not None and reading in reader.streams:
            reader.streams.remove(reading)
            if not reader.streams:
                if reading.group is None:
                    del self._readers[reading.reader]  # a reader of its own: done
                else:  # its next shard may open a moment later: it keeps its window a while
                    reader.idle_since = time.perf_counter()
                    self._start = max(START_WINDOW, reader.window)  # (and the next pass starts there)
        self._grant() if at_once else self._grant_soon()

    def unsized_before(self, reading: _Reading) -> bool:
        """Whether a stream that `reading`'s reader reads before it has not said its size yet."""
        reader = self._readers.get(reading.reader)
        for stream in reader.streams if reader is not None else ():
            if stream is reading:
                return False
            if stream.size is None:
                return True
        return False

    def sized(self, reading: _Reading, size: int) -> None:
        """The stream's size is known: the streams after it may now be placed in the window."""
        reading.size = size
        self._grant()

    async def acquire(self, part: "_Part") -> None:
        if part.promoted:
            return
        future = asyncio.get_running_loop().create_future()
        entry = [part.key, part.size, future, part]
        part.waiter = entry
        self._waiting.append(entry)
        self._grant()
        try:
            await future
        finally:
            part.waiter = None
            if future.cancelled() or not future.done():
                entry[2] = None  # dropped at the next grant
                self._grant_soon()  # (cancelled: its stream is closing, and others of its pass may be)

    def promote(self, part: "_Part") -> None:
        """`part` is now the front of its stream: it needs no budget (and returns what it held)."""
        part.promoted = True
        if part.room is not None and not part.room.done():
            part.room.set_result(None)  # (paused for room: its reader waits for it now)
        if part.waiter is not None and part.waiter[2] is not None and not part.waiter[2].done():
            part.waiter[2].set_result(None)
            part.waiter[2] = None
        self.release(part)

    def advance(self, reading: _Reading, position: int) -> None:
        """The stream's reader has consumed it up to `position`: its window moves on (and is
        resized to what the reader consumes)."""
        reader = self._readers.get(reading.reader)
        if reader is not None and position > reading.read_to and reader.streams and reader.streams[0] is reading:
            # (only the stream being read: one opened ahead fills its buffer long before its reader gets there)
            reader.consume(position - reading.read_to, self.limit, time.perf_counter(),
                           reading.tuning.latency_or_default)
        reading.read_to = position
        self._grant()

    def starve(self, part: "_Part") -> None:
        """The reader of `part`'s stream waits for it (the stream's front): if it has no bytes yet
        and was granted less than a latency ago (or not yet: held back by the window, the budget or
        an earlier stream's unknown size), the window held the reader back, and widens. (A part that
        started long ago and is late is the server's doing: a wider window would not have helped.)"""
        if part.done or part.chunks or part.reading is None:
            return
        now = time.perf_counter()
        latency = part.reading.tuning.latency_or_default
        if part.granted is not None and now - part.granted >= latency:
            return
        reader = self._readers.get(part.reading.reader)
        if reader is not None and reader.starve(self.limit, now, latency):
            self._grant()

    def release(self, part: "_Part", at_once: bool = True) -> None:
        if part.held:
            self.used -= part.held
            part.held = 0
            self._grant() if at_once else self._grant_soon()

    def _grant_soon(self) -> None:
        """Grant a moment later: what a stream closed part way frees. Closing a pass closes its
        streams one by one, the one being read first, and granted at once its bytes went to the
        parts of the streams about to close next (requests sent only to be dropped); by then they
        say they are abandoned (`Demand.abandoned`)."""
        loop = asyncio.get_running_loop()
        if self._soon is None or self._soon_loop is not loop:  # (a loop shut down with a grant put off: see shutdown_loop)
            self._soon, self._soon_loop = loop.call_later(GRANT_AFTER_CLOSE_S, self._granted_soon), loop

    def _granted_soon(self) -> None:
        self._soon = None
        self._grant()

    def _before(self) -> Dict[int, Tuple[Optional[int], int]]:
        """For each open stream (by id): the bytes its reader reads before it (None: unknown yet),
        and its reader's window."""
        before: Dict[int, Tuple[Optional[int], int]] = {}
        for reader in self._readers.values():
            total: Optional[int] = 0
            window = min(self.limit, reader.window)
            for reading in reader.streams:
                before[id(reading)] = (total, window)
                remaining = reading.remaining
                total = None if total is None or remaining is None else total + remaining
        return before

    def _grant(self) -> None:
        waiting = [entry for entry in self._waiting if entry[2] is not None and not entry[2].done()]
        self._waiting = waiting
        if not waiting:
            return
        waiting.sort(key=operator.itemgetter(0))  # reading order: (stream, part)
        before = self._before()
        for entry in waiting:
            _key, size, future, part = entry
            reading = part.reading
            if reading is not None and reading.demand is not None and reading.demand.abandoned:
                continue  # (closing a pass closes its streams one by one: not a request for each that is left)
            if reading is not None:
                ahead, window = before.get(id(reading), (None, self.limit))
                if ahead is None:
                    continue  # a stream its reader reads first has not said its size yet
                nearest = ahead == 0 and part.start <= reading.read_to
                if ahead + part.stop - reading.read_to > window and not nearest:
                    continue  # beyond its reader's window: later, as the reader moves on
            if self.used + size > self.limit and self.used > 0:
                break  # strict priority: nothing later may pass the part that needs the bytes
            self.used += size
            part.held = size
            future.set_result(None)
            entry[2] = None  # (dropped from _waiting at the next grant)


_budget: Optional[PartBudget] = None


def _forget_budget() -> None:
    global _budget
    _budget = None  # a forked child (a DataLoader worker) has its own loop and no parts in flight


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_budget)


def part_budget(limit: int) -> PartBudget:
    """The process's budget (created with `limit` by the first stream that asks; a later, larger
    `limit` raises it)."""
    global _budget
    if _budget is None:
        _budget = PartBudget(limit)
    elif limit > _budget.limit:
        _budget.limit = limit
        _budget._grant()
    return _budget


class _Part:
    """One byte range [start, stop) downloading on its own connection into a list of chunks."""

    __slots__ = ("start", "stop", "key", "reading", "chunks", "received", "done", "error", "event", "task",
                 "promoted", "held", "waiter", "granted", "room")

    def __init__(self, start: int, stop: int, key: Tuple[int, int], reading: Optional[_Reading] = None) -> None:
        self.start, self.stop, self.key, self.reading = start, stop, key, reading
        self.chunks: collections.deque = collections.deque()
        self.received = 0
        self.done = False
        self.error: Optional[BaseException] = None
        self.event = asyncio.Event()
        self.task: Optional[asyncio.Task] = None
        self.promoted = False
        self.held = 0
        self.waiter: Optional[list] = None
        self.granted: Optional[float] = None  # when it could start downloading
        self.room: Optional[asyncio.Future] = None  # set while it waits for unread bytes to fall (PartBudget.room)

    @property
    def size(self) -> int:
        return self.stop - self.start

    async def run(self, url: str, options: Any, ranged: Callable[..., AsyncGenerator[bytes, None]], budget: PartBudget) -> None:
        try:
            await budget.acquire(self)
            self.granted = started = time.perf_counter()
            retries = fetch_stats().retries
            first: Optional[float] = None
            chunks = ranged(url, options=options, start=self.start, stop=self.stop)
            try:
                async for chunk in chunks:
                    if first is None:
                        first = time.perf_counter()
                    self.received += len(chunk)
                    self.chunks.append(chunk)
                    self.event.set()
                    budget.unread += len(chunk)
                    if budget.unread >= UNREAD_CAP and not self.promoted:
                        await budget.room(self)  # (the fetcher holds its transfer's silence meanwhile)
            finally:
                await chunks.aclose()
            if first is not None:
                done = time.perf_counter()
                # (a part that was retried, here or anywhere in the process, says little of the time
                # parts take: its backoff would widen every window)
                clean = fetch_stats().retries == retries
                tuning = self.reading.tuning if self.reading is not None else tuning_for(url)
                tuning.record(first - started, self.received, done - first, done - started if clean else None)
        except Exception as exc:  # noqa: BLE001 - raised in order, when this part is at the front
            self.error = exc
        finally:
            self.done = True
            self.event.set()


async def _learn_size(url: str, options: Any, start: int, ranged: Callable[..., AsyncGenerator[bytes, None]],
                      on_size: Callable[[Optional[int]], None]) -> None:
    """Ask for one byte of `url` at `start`, only for the size its response tells (`on_size`).

    A stream opened ahead may place its parts in its reader's window only once every stream read
    before it has said its size, and a stream says it in its first part's response. Without this,
    the streams opened together at the start of a pass learned their sizes one after the other,
    one time to first byte each (8 shards of 4 MB at 50 ms: ~0.45 s, where the bytes take ~0.15 s
    over enough connections). The probe holds no budget and is not retried: should it fail, the
    first part's own response tells the size as before, and reports the error.
    """
    chunks = ranged(url, options=dataclasses.replace(options, retries=0), start=start, stop=start + 1,
                    on_size=on_size)
    try:
        async for _ in chunks:
            break  # (a server that ignores Range sends it all: one chunk, then the connection goes)
    except Exception:  # noqa: BLE001 - the first part fetches the same bytes, with retries, and raises in order
        pass
    finally:
        await chunks.aclose()


async def parallel_stream(
    url: str, options: Any, start: int, ranged: Callable[..., AsyncGenerator[bytes, None]],
) -> AsyncGenerator[bytes, None]:
    """The bytes of `url` from `start`, fetched as parts over up to options.parallel_parts
    connections at once under the process's part budget, yielded in order. The first part's
    response tells the object's size (its Content-Range), or a one-byte request sent at once
    when the first part must wait for an earlier stream's size (`_learn_size`). One connection
    when the server serves no ranges, or when the rest fits in one part.

    `ranged(url, *, options, start, stop, on_size, identity)` fetches a byte range and calls
    `on_size` once with the object's size (None: unknown, or no ranges served); `identity`, one
    dict for every range of the download, is the fetcher's to keep the object's validator in.
    """
    # The parts of one download share what the first response tells of the object (its ETag):
    # each refuses another version of it (the object replaced mid-download), as a resume does.
    ranged = functools.partial(ranged, identity={})
    budget = part_budget(options.part_budget)
    tuning = tuning_for(url)
    part_size = options.part_size or tuning.part_size(DEFAULT_PART, budget.limit, options.parallel_parts)
    order = next(_stream_order)
    index = itertools.count()
    wanted = demand.get()
    reading = budget.open(None if wanted is None else wanted.group, start, part_size, tuning)
    reading.demand = wanted
    first = _Part(start, start + part_size, (order, next(index)), reading)
    window: collections.deque = collections.deque([first])  # parts started, the front one first
    pending: collections.deque = collections.deque()
    sized: asyncio.Future = asyncio.get_running_loop().create_future()

    def on_size(size: Optional[int]) -> None:
        if not sized.done():
            sized.set_result(size)

    def promote_front() -> None:
        if window:
            budget.starve(window[0])  # (before the promotion, which grants it)
            budget.promote(window[0])

    if wanted is not None:
        wanted.callback = promote_front
    if wanted is None or wanted.waiting:  # (a consumer that blocked before we listened: now)
        budget.promote(first)

    def fill() -> None:
        while pending and len(window) < options.parallel_parts:
            part = pending.popleft()
            part.task = asyncio.ensure_future(part.run(url, options, ranged, budget))
            window.append(part)

    probe: Optional[asyncio.Task] = None
    try:
        first.task = asyncio.ensure_future(first.run(url, options, functools.partial(ranged, on_size=on_size), budget))
        if budget.unsized_before(reading):  # its first part waits for that size: learn ours meanwhile
            probe = asyncio.ensure_future(_learn_size(url, options, start, ranged, on_size))
        await asyncio.wait([sized, first.task], return_when=asyncio.FIRST_COMPLETED)
        size = sized.result() if sized.done() else None
        if size is None and first.error is None:  # no Range support, or no size: one connection reads it all
            first.task.cancel()
            await asyncio.gather(first.task, return_exceptions=True)
            window.clear()
            budget.taken(sum(map(len, first.chunks)))  # (what it had received is read again below)
            first.chunks.clear()
            budget.release(first)  # (granted before the size came: its bytes would stay used for ever)
            budget.sized(reading, start)  # it holds no budget: the streams after it need not wait for it
            single = ranged(url, options=options, start=start)
            try:
                async for chunk in single:
                    yield chunk
            finally:
                await single.aclose()
            return
        if size is None:  # the first request failed: its error is raised below, in order
            size = first.stop
        first.stop = max(start, min(first.stop, size))  # what the first part must deliver
        budget.sized(reading, max(start, size))
        bounds = [(offset, min(offset + part_size, size)) for offset in range(start + part_size, size, part_size)]
        pending.extend(_Part(lo, hi, (order, next(index)), reading) for lo, hi in bounds)
        fill()
        while window:
            front = window[0]
            if wanted is None or wanted.waiting:
                budget.promote(front)  # its reader waits for it: it never waits for the budget
            while True:
                if front.chunks:
                    chunk = front.chunks.popleft()
                    budget.taken(len(chunk))
                    yield chunk
                    del chunk  # (not held while the consumer waits for the next one)
                elif front.done:
                    break
                else:
                    front.event.clear()
                    await front.event.wait()
            if front.error is not None:
                raise front.error
            if front.received != front.stop - front.start:
                raise FetchError(
                    f"object size changed during the download: bytes {front.start}-{front.stop - 1} "
                    f"of {size} gave {front.received} bytes", url=url, offset=front.start + front.received,
                )
            budget.release(window.popleft())  # handed on: its memory is free
            budget.advance(reading, front.stop)  # and the reader's window moves: the next parts may start
            fill()
    finally:
        at_once = not window  # (read to its end; else closed part way: see PartBudget._grant_soon)
        if wanted is not None:
            wanted.callback = None
        if probe is not None and not probe.done():
            probe.cancel()
            await asyncio.gather(probe, return_exceptions=True)
        for part in window:
            budget.release(part, at_once)
        tasks = [part.task for part in window if part.task is not None and not part.task.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        for part in window:
            budget.release(part, at_once)  # a part granted while it was being cancelled
            if part.chunks:
                budget.taken(sum(map(len, part.chunks)))
                part.chunks.clear()
        budget.close(reading, at_once)
