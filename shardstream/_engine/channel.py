"""The background-worker skeleton: a bounded channel between threads that knows about stopping.

Items travel in chunks (lists) or as futures of chunks; the end of a stream and exceptions travel
as items too (`END`, `Failure`), so the consumer re-raises an exception in its own thread with
the original traceback. Every blocking wait polls a stop event, so shutdown is prompt.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Optional

from .._base.cancel import Stopped
from .stats import QueueStats

__all__ = ["Channel", "END", "Failure", "Stopped", "payload_bytes"]

_POLL_S = 0.05


class Failure:
    """An exception shipped through a channel."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class _End:
    def __repr__(self) -> str:
        return "END"


END: Any = _End()


def payload_bytes(item: Any, depth: int = 2) -> int:
    """About the bytes an item holds: bytes and strings, arrays and tensors (`nbytes`), in
    tuples, lists and dicts to `depth` levels (the first 64 entries of each, scaled up); 0 for
    anything else. Cheap: a chunk is sized from its first item."""
    if isinstance(item, (bytes, bytearray, str)):
        return len(item)
    nbytes = getattr(item, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    if depth and isinstance(item, (tuple, list, dict)):
        values = list(item.values()) if isinstance(item, dict) else item
        if not values:
            return 0
        head = values[:64]
        return sum(payload_bytes(v, depth - 1) for v in head) * len(values) // len(head)
    return 0


class _Sized:
    """An item put with its size in bytes (see Channel.put)."""

    __slots__ = ("item", "nbytes")

    def __init__(self, item: Any, nbytes: int) -> None:
        self.item, self.nbytes = item, nbytes


class Channel:
    """A bounded FIFO between two threads, with wait/occupancy accounting.

    `capacity` bounds the entries; `max_bytes`, if given, the bytes of the entries put with a
    size (`put(item, nbytes)`) beyond the first: a queue of 8 chunks holds 8 batches when every
    chunk is one (slow, large) batch, 1.2 GB of them where webdataset holds ~3."""

    def __init__(self, name: str, capacity: int, stop: threading.Event, max_bytes: Optional[int] = None) -> None:
        self._queue: "queue.Queue[Any]" = queue.Queue(maxsize=capacity)
        self._stop = stop
        self.stats = QueueStats(name, capacity)
        self._max_bytes = max_bytes
        self._bytes = 0  # of the sized entries queued
        self._room = threading.Condition()

    def put(self, item: Any, nbytes: int = 0) -> None:
        """Put, waiting while full; raise Stopped if the run stops meanwhile."""
        q = self._queue
        waited = 0.0
        if nbytes and self._max_bytes is not None:
            waited = self._reserve(nbytes)
            item = _Sized(item, nbytes)
        try:
            q.put_nowait(item)
        except queue.Full:
            start = time.perf_counter()
            while True:
                if self._stop.is_set():
                    raise Stopped()
                try:
                    q.put(item, timeout=_POLL_S)
                    break
                except queue.Full:
                    continue
            waited += time.perf_counter() - start
        self.stats.on_put(q.qsize(), waited)

    def _reserve(self, nbytes: int) -> float:
        """Wait until `nbytes` more fit (or nothing sized is queued); count them in."""
        start = time.perf_counter()
        with self._room:
            while self._bytes and self._bytes + nbytes > self._max_bytes:  # type: ignore[operator]
                if self._stop.is_set():
                    raise Stopped()
                self._room.wait(_POLL_S)
            self._bytes += nbytes
        return time.perf_counter() - start

    def _taken(self, entry: Any) -> Any:
        if type(entry) is not _Sized:
            return entry
        with self._room:
            self._bytes -= entry.nbytes
            self._room.notify()
        return entry.item

    def get(self, timeout: Optional[float] = None) -> Any:
        """Get, waiting while empty; raise Stopped if the run stops meanwhile."""
        q = self._queue
        try:
            return self._taken(q.get_nowait())
        except queue.Empty:
            pass
        start = time.perf_counter()
        try:
            while True:
                if self._stop.is_set():
                    raise Stopped()
                try:
                    return self._taken(q.get(timeout=_POLL_S))
                except queue.Empty:
                    if timeout is not None and time.perf_counter() - start > timeout:
                        raise
        finally:
            self.stats.on_get(time.perf_counter() - start)

    def drain(self) -> list:
        """Remove and return whatever is queued (used at shutdown)."""
        items = []
        while True:
            try:
                items.append(self._taken(self._queue.get_nowait()))
            except queue.Empty:
                return items
