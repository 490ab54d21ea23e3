"""The tiered shard cache: memory, then local disk, then the origin, with stream-through.

`ShardCache.stream(url, open_origin)` yields a shard's bytes from the fastest tier holding it.
On a miss the origin's chunks go to the consumer and into every tier's writer in one pass, so a
first epoch with the cache on costs no extra read; a tier keeps the shard only when the origin
ran to its end (an early close or an origin error discards the temp file). Across processes a
disk tier's `claim` makes exactly one process download a shard while the others wait for it
and then read the committed file.

The cache never decides what to fetch: the caller hands it `open_origin(url) -> Iterable[bytes]`.
"""

from __future__ import annotations

import os
from typing import Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence

from ._cachetiers import DiskTier, MemoryTier, TierCounters
from ._errors import UsageError

__all__ = ["ShardCache", "cache_from_options"]

ORIGIN_FIELDS = ("fetches", "bytes_served", "errors")

OpenOrigin = Callable[[str], Iterable[bytes]]


def _close(obj) -> None:
    close = getattr(obj, "close", None)
    if close is not None:
        close()


class ShardCache:
    """Tiers searched in order (typically `MemoryTier`, then `DiskTier`), then the origin.

    Thread-safe; one instance may serve many shards at once. `stats()` reports every tier's
    counters and the origin's.
    """

    def __init__(self, tiers: Sequence = ()) -> None:
        self.tiers = tuple(tiers)
        names = [tier.name for tier in self.tiers]
        if len(set(names)) != len(names) or "origin" in names:
            raise ValueError(f"cache tier names must be unique and not 'origin': {names}")
        self.origin = TierCounters("origin", ORIGIN_FIELDS)

    def stream(self, url: str, open_origin: OpenOrigin) -> Iterator[bytes]:
        """Yield the bytes of `url` in chunks, from the first tier that has it, else the origin.

        Raises whatever `open_origin` or its iterator raises (after discarding partial writes).
        Close the iterator to stop early; nothing partial is ever committed.
        """
        above: List = []
        for tier in self.tiers:
            source = tier.lookup(url)
            if source is not None:
                yield from self._serve(url, tier, source, above)
                return
            above.append(tier)
        claims: Dict[str, object] = {}
        try:
            for tier in self.tiers:
                if tier.shared:
                    claim = tier.claim(url)  # may wait for another process's download
                    if claim is not None:
                        claims[tier.name] = claim
            for index, tier in enumerate(self.tiers):
                if tier.shared:
                    source = tier.lookup(url, repair=tier.name in claims)
                    if source is not None:  # committed while we waited: let the others in, read it
                        self._release(claims)
                        yield from self._serve(url, tier, source, self.tiers[:index])
                        return
            for tier in self.tiers:
                tier.counters.add(misses=1)
            self.origin.add(fetches=1)
            try:
                chunks = open_origin(url)
            except Exception:
                self.origin.add(errors=1)
                raise
            writers = []
            for tier in self.tiers:
                if not tier.shared or tier.name in claims:
                    writer = tier.writer(url)
                    if writer is not None:
                        writers.append(writer)
            yield from self._pump(chunks, self.origin, writers)
        finally:
            self._release(claims)  # after _pump committed: waiters then find the file

    def _serve(self, url: str, tier, source, above: Sequence) -> Iterator[bytes]:
        tier.counters.add(hits=1)
        for upper in above:
            upper.counters.add(misses=1)
        # Fill faster private tiers on the way (shared ones would need a claim: not worth it).
        writers = [w for w in (t.writer(url, size_hint=source.size) for t in above if not t.shared) if w is not None]
        yield from self._pump(source, tier.counters, writers)

    @staticmethod
    def _pump(chunks: Iterable[bytes], counters: TierCounters, writers: List) -> Iterator[bytes]:
        """Hand each chunk to the consumer and to every writer; commit only a complete stream."""
        complete = False
        iterator = iter(chunks)
        try:
            for chunk in iterator:
                for writer in writers:
                    writer.write(chunk)
                counters.add(bytes_served=len(chunk))
                yield chunk
            complete = True
        except Exception:
            counters.add(errors=1)
            raise
        finally:
            for writer in writers:
                if complete:
                    writer.commit()
                else:
                    writer.abort()
            if iterator is not chunks:
                _close(iterator)
            _close(chunks)

    @staticmethod
    def _release(claims: Dict[str, object]) -> None:
        while claims:
            _, claim = claims.popitem()
            claim.release()

    def local_path(self, url: str) -> Optional[str]:
        """The path of a validated committed copy of `url` in a disk tier, else None.

        For a memory-mapped fast path or webdataset's `__local_path__`; the file may be evicted
        later, so open it promptly (an open file survives eviction).
        """
        for tier in self.tiers:
            if isinstance(tier, DiskTier):
                source = tier.lookup(url)
                if source is not None:
                    source.close()
                    return source.path
        return None

    def hit_path(self, url: str) -> Optional[str]:
        """On a disk-tier hit (no faster tier has it), count the hit and return the committed
        file's path, so the caller can memory-map it instead of streaming it; else None."""
        above: List = []
        for tier in self.tiers:
            if isinstance(tier, DiskTier):
                source = tier.lookup(url)
                if source is None:
                    return None
                size = source.size
                source.close()
                tier.counters.add(hits=1, bytes_served=size or 0)
                for upper in above:
                    upper.counters.add(misses=1)
                return source.path
            if url in tier:
                return None
            above.append(tier)
        return None

    def stats(self) -> Dict[str, Dict[str, int]]:
        """Counters keyed by tier name, plus "origin" (fetches, bytes_served, errors)."""
        snapshot = {tier.name: tier.counters.snapshot() for tier in self.tiers}
        snapshot["origin"] = self.origin.snapshot()
        return snapshot

    def __getstate__(self):  # tiers pickle as configuration; counters restart in the new process
        return {"tiers": self.tiers}

    def __setstate__(self, state) -> None:
        self.__init__(state["tiers"])


def _env_size(text: str) -> int:
    try:
        return int(float(text))  # webdataset takes int(); "1e9" is friendlier and harmless
    except ValueError:
        raise UsageError(f"WDS_CACHE_SIZE must be a number of bytes, got {text!r}") from None


def cache_from_options(
    cache_dir: Optional[str] = None,
    cache_size: float = -1,
    memory_bytes: int = 0,
    *,
    environ: Optional[Mapping[str, str]] = None,
    **disk_options,
) -> Optional[ShardCache]:
    """Map webdataset's `cache_dir` / `cache_size` (and `WDS_CACHE` / `WDS_CACHE_SIZE`) onto tiers.

    As in webdataset 1.0.2's `WebDataset`: the environment variables override the arguments;
    the directory is `~`-expanded and must exist; no directory or a size of 0 means no disk
    cache; a negative size means no bound; a positive size is the byte bound (LRU eviction).

    Args:
        memory_bytes: also keep shards of at most this many bytes in a memory LRU (0: off).
        environ: the environment to read (default `os.environ`).
        disk_options: passed to `DiskTier` (lock_timeout, stall_timeout, ...).

    Returns:
        A `ShardCache`, or None when no tier is asked for (stream straight from the origin).

    Raises:
        UsageError: the directory does not exist, or WDS_CACHE_SIZE is not a number.
    """
    env = os.environ if environ is None else environ
    if env.get("WDS_CACHE"):
        cache_dir = env["WDS_CACHE"]
    if env.get("WDS_CACHE_SIZE"):
        cache_size = _env_size(env["WDS_CACHE_SIZE"])
    tiers: List = []
    if memory_bytes and memory_bytes > 0:
        tiers.append(MemoryTier(memory_bytes))
    if cache_dir is not None and int(cache_size) != 0:
        cache_dir = os.path.expanduser(os.fspath(cache_dir))
        if not os.path.isdir(cache_dir):
            raise UsageError(f"cache directory {cache_dir} does not exist")
        tiers.append(DiskTier(cache_dir, int(cache_size) if cache_size > 0 else None, **disk_options))
    return ShardCache(tiers) if tiers else None
