"""A disk-cache hit parsed in place, from the shard's start or from a resume offset, and what
happens when one of its blocks is corrupt.

A hit is memory-mapped and parsed like a local shard (`mapped_member_batches`), each block
checked against its recorded digest before any of its bytes are parsed. Its payloads are copied
out of the map, where a local shard's large ones are read with os.pread: the check has faulted in
every page already, and copying from them costs far less system time than pread (see
`mapped_member_batches`). (Checking blocks ahead on another thread was measured too, and lost:
8.9k against 11.2k samples/s over 25 fresh processes each, with more CPU; our reading: a hit maps
every page, so unmapping it flushes TLBs, and with a checking thread busy on the other core each
flush interrupts it.) A read that resumes
mid-shard starts at the saved byte offset: its checks begin at the block holding that offset,
and the blocks before it are neither checked nor parsed. A corrupt block stops the map before it
is parsed; the shard is then read again from byte 0 from a fresh copy (`ShardCache.reread`:
the corrupt file is evicted and fetched again, its good blocks checked once more) and parsed
from there, dropping every member that lies before the next one the map would have delivered.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional

from .._cache.check import CorruptCacheFile, VerifiedFile
from .._cache.shardcache import ShardCache
from .._tar.codecs import MAGIC_BYTES, sniff
from .._tar.reader import TarMember
from .members import SourceStats, chunk_member_batches, mapped_member_batches

__all__ = ["hit_member_batches", "open_hit"]


def _uncompressed(fd: int) -> bool:
    """Whether the open file `fd` does not start like a gzip, bzip2 or xz stream (can be mapped)."""
    return sniff(os.pread(fd, MAGIC_BYTES, 0))[0] is None


def open_hit(cache: ShardCache, url: str, start_offset: int = 0) -> Optional[VerifiedFile]:
    """The disk hit of `url` to parse in place from byte `start_offset` (uncompressed), else None."""
    return cache.open_mapped(url, accept=_uncompressed, start=start_offset)


def hit_member_batches(
    cache: ShardCache,
    url: str,
    hit: VerifiedFile,
    open_origin: Callable[[str], Iterable[bytes]],
    stats: Optional[SourceStats] = None,
    start_offset: int = 0,
    info: Optional[Dict[str, Any]] = None,
) -> Iterator[List[TarMember]]:
    """The members of the hit `hit` (from `open_hit(cache, url, start_offset)`) from the member
    header at `start_offset`, in batches. A corrupt block is never parsed: the rest then comes
    from the re-read, without a member twice or one missing."""
    if info is not None:
        info["compressed"] = False
    after = start_offset  # the members at lower offsets were delivered, or precede the resume point
    try:
        try:
            for members in mapped_member_batches(
                hit.path, url, stats, start_offset, fd=hit.file.fileno(), check=hit.check,
                window=hit.record.block_size,
            ):
                if members:
                    after = members[-1].offset + 1
                yield members
            return
        except CorruptCacheFile as exn:
            if exn.source is not hit:
                raise
            failure = exn
    finally:
        hit.close()  # (after a failure the file stays open until the re-read has used it)
    # The re-read starts at byte 0 (the fresh copy is written to the cache whole, and the blocks
    # before the bad one are compared with the record there); offsets are those of the map.
    chunks = cache.reread(url, open_origin, failure, settled=False)
    for members in chunk_member_batches(chunks, url, stats, 0, info):
        if members and members[0].offset < after:
            members = [member for member in members if member.offset >= after]
        yield members
