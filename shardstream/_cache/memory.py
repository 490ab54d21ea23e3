"""The in-memory tier (a byte-bounded LRU of whole shards) and the counters every tier keeps."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Callable, Iterator, List, Optional, Tuple


from .._base.counters import Counters

__all__ = ["CHUNK_SIZE", "MemoryTier", "TIER_FIELDS", "TierCounters"]

logger = logging.getLogger("shardstream._cache.tiers")

CHUNK_SIZE = 1 << 20
TIER_FIELDS = (
    "hits", "misses", "bytes_served", "bytes_written", "evictions", "invalid", "corrupt", "discarded", "errors",
    "bypassed", "followed",
)


class TierCounters(Counters):
    """Event counters of one tier (hits, misses, bytes served and written, ...). Counts are per
    process: a pickled copy starts from zero."""

    FIELDS = TIER_FIELDS
    PICKLE_COUNTS = False

    def __init__(self, name: str, fields: Optional[Tuple[str, ...]] = None) -> None:
        super().__init__(fields)
        self.name = name


class _ChunkSource:
    """A memory hit: the chunks exactly as they were stored (no copies)."""

    def __init__(self, chunks: Tuple[bytes, ...], size: int) -> None:
        self.chunks = chunks
        self.size = size
        self.path: Optional[str] = None

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.chunks)

    def close(self) -> None:
        pass


class _MemoryWriter:
    """Collects a shard's chunks; gives up (keeps nothing) once it outgrows the tier."""

    def __init__(self, tier: "MemoryTier", url: str) -> None:
        self.tier, self.url = tier, url
        self.chunks: List[bytes] = []
        self.size = 0
        self.live = True

    def write(self, chunk: bytes) -> None:
        self.write_many([chunk], len(chunk))

    def reserve(self, size: int) -> None:
        """The shard will be `size` bytes long: give up now when it can never fit."""
        if self.live and size > self.tier.max_bytes:
            self.abort()

    def write_many(self, chunks: List[bytes], nbytes: int) -> None:
        """Append `chunks` (immutable bytes, `nbytes` in all)."""
        if self.live:
            self.size += nbytes
            if self.size > self.tier.max_bytes:
                self.abort()
            else:
                self.chunks.extend(chunks)

    def commit(self) -> bool:
        live, self.live = self.live, False
        return live and self.tier.put(self.url, self.chunks)

    def commit_soon(self, then: Callable[[], None]) -> None:
        """`commit` (in memory: at once), then `then`: the writers' common interface."""
        try:
            self.commit()
        finally:
            then()

    def abort(self) -> None:
        if self.live:
            self.live = False
            self.chunks = []
            self.tier.counters.add(discarded=1)


class MemoryTier:
    """A byte-bounded LRU of whole shards in this process's memory (opt-in).

    Only shards of at most `max_bytes` are kept; `max_bytes=0` keeps nothing.
    """

    shared = False

    def __init__(self, max_bytes: int, *, name: str = "memory") -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = int(max_bytes)
        self.name = name
        self.counters = TierCounters(name)
        self._lock = threading.Lock()
        self._entries: "OrderedDict[str, Tuple[Tuple[bytes, ...], int]]" = OrderedDict()
        self._nbytes = 0

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, url: str) -> bool:
        return url in self._entries

    def lookup(self, url: str, *, repair: bool = False) -> Optional[_ChunkSource]:
        """The shard's chunks if held (and mark it most recently used), else None."""
        with self._lock:
            entry = self._entries.get(url)
            if entry is None:
                return None
            self._entries.move_to_end(url)
        return _ChunkSource(*entry)

    def writer(self, url: str, size_hint: Optional[int] = None) -> Optional[_MemoryWriter]:
        """A writer collecting `url`'s chunks, or None when the shard cannot fit."""
        if self.max_bytes <= 0 or (size_hint is not None and size_hint > self.max_bytes):
            return None
        return _MemoryWriter(self, url)

    def put(self, url: str, chunks) -> bool:
        """Keep a whole shard (bytes or a sequence of chunks), evicting least recently used ones."""
        chunks = (chunks,) if isinstance(chunks, (bytes, bytearray, memoryview)) else chunks
        chunks = tuple(c if type(c) is bytes else bytes(c) for c in chunks)
        size = sum(len(c) for c in chunks)
        if self.max_bytes <= 0 or size > self.max_bytes:
            return False
        evicted = 0
        with self._lock:
            old = self._entries.pop(url, None)
            if old is not None:
                self._nbytes -= old[1]
            while self._entries and self._nbytes + size > self.max_bytes:
                _, (_, dropped) = self._entries.popitem(last=False)
                self._nbytes -= dropped
                evicted += 1
            self._entries[url] = (chunks, size)
            self._nbytes += size
        self.counters.add(bytes_written=size, evictions=evicted)
        return True

    def discard(self, url: str) -> bool:
        with self._lock:
            entry = self._entries.pop(url, None)
            if entry is not None:
                self._nbytes -= entry[1]
        return entry is not None

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._nbytes = 0

    def __getstate__(self):  # contents stay in this process; a pickled tier starts empty
        return {"max_bytes": self.max_bytes, "name": self.name}

    def __setstate__(self, state) -> None:
        MemoryTier.__init__(self, state["max_bytes"], name=state["name"])


