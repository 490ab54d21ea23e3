"""Cache integrity: a digest per block of every cached shard, recorded when it is written and
checked as it is read, before any of its bytes are handed out.

A committed disk-cache file has a sidecar record (`ShardRecord`): its size, a digest of its URL,
the block size and the XXH3-64 digest of each block. The writer computes the digests from the
chunks it writes (stream-through: no extra pass over the bytes); `VerifiedFile` reads a file
block by block and checks each block before it yields it, so a corrupt block never reaches the
tar reader. A failure raises `CorruptCacheFile`, which names the cache file; `ShardCache` catches
it, evicts the file and continues the stream from the origin (`Resume`), after checking that the
origin's bytes equal those already handed out.

Why XXH3-64 (the `xxhash` package): it checks about 20 GB/s a core on the build machine, where
zlib's CRC-32 manages 2.3 and blake2b 1, so checking every block of a hit costs a few percent of
reading it instead of half. Like a CRC it is made for accidental corruption (bad disks, torn
writes, stray writers), the kind a cache suffers; a cryptographic hash would buy nothing: whoever
can write the cache directory can rewrite its records too. Records of earlier formats (CRC-32,
or the size only) are never trusted: such files are fetched again.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Callable, List, NamedTuple, Optional, Sequence, Tuple

import xxhash

from .._base.errors import FetchError, notes_state, worker_where

__all__ = [
    "BlockDigest", "CorruptCacheFile", "Resume", "ShardRecord", "VerifiedFile", "block_digest", "read_record",
    "write_record",
]

# 3: XXH3-64 per block. 2 (CRC-32 per block) and 1 (no "format" key, the size only) are never
# trusted now: their files are fetched again.
RECORD_FORMAT = 3
DIGEST_NAME = "xxh3_64"
block_digest: Callable[..., int] = xxhash.xxh3_64_intdigest  # the digest of one whole block


class ShardRecord(NamedTuple):
    """What a sidecar says about its committed shard. `crcs` (the blocks' digests) is None for
    an old record without a digest of ours (a file written by an earlier version: unverifiable,
    so never served)."""

    size: int
    url_sha256: str
    block_size: int
    crcs: Optional[Tuple[int, ...]]

    def verifiable(self, size: int, url_sha256: str) -> bool:
        """Whether this record describes a file of `size` bytes for the URL, block by block."""
        if self.crcs is None or self.block_size <= 0:
            return False
        return (self.size, self.url_sha256) == (size, url_sha256) and len(self.crcs) == -(-size // self.block_size)


def write_record(f, size: int, url_sha256: str, block_size: int, crcs: List[int]) -> None:
    """Write a record as JSON to the open text file `f`."""
    packed = struct.pack(f">{len(crcs)}Q", *crcs).hex()
    # (json.dumps, not json.dump: dump's pure-Python encoder leaves reference cycles of closures
    # for the collector, a few hundred objects per shard committed)
    f.write(json.dumps({"format": RECORD_FORMAT, "size": size, "url_sha256": url_sha256, "block_size": block_size,
                        DIGEST_NAME: packed}))


def read_record(path: str) -> Optional[ShardRecord]:
    """The record in the sidecar at `path`, or None when it is missing or unreadable."""
    try:
        with open(path) as f:
            meta = json.load(f)
        size, url_sha256 = int(meta["size"]), str(meta["url_sha256"])
        if meta.get("format") != RECORD_FORMAT:
            return ShardRecord(size, url_sha256, 0, None)
        raw = bytes.fromhex(meta[DIGEST_NAME])
        return ShardRecord(size, url_sha256, int(meta["block_size"]), struct.unpack(f">{len(raw) // 8}Q", raw))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, struct.error):
        return None


class BlockDigest:
    """The digest of each `block_size` block of a byte stream fed in chunks of any size.

    `on_block(index, digest)`, if given, is called as each full block completes (the writer
    publishes its progress that way); the last, short block only comes with `finish`.
    """

    __slots__ = ("block_size", "crcs", "_state", "_fill", "_on_block")

    def __init__(self, block_size: int, on_block: Optional[Callable[[int, int], None]] = None) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be > 0, got {block_size}")
        self.block_size = block_size
        self.crcs: List[int] = []
        self._state = xxhash.xxh3_64()
        self._fill = 0  # bytes of the current block seen so far
        self._on_block = on_block

    def update(self, chunk) -> None:
        n = len(chunk)
        if self._fill + n < self.block_size:  # the common case: no block boundary in the chunk
            self._state.update(chunk)
            self._fill += n
            return
        view, pos = memoryview(chunk), 0
        while pos < n:
            take = min(n - pos, self.block_size - self._fill)
            self._state.update(view[pos : pos + take])
            self._fill += take
            pos += take
            if self._fill == self.block_size:
                self._close_block()

    def _close_block(self) -> None:
        self.crcs.append(self._state.intdigest())
        self._state.reset()
        self._fill = 0
        if self._on_block is not None:
            self._on_block(len(self.crcs) - 1, self.crcs[-1])

    def finish(self) -> List[int]:
        """The digests of all blocks, the last one possibly short."""
        if self._fill:
            self.crcs.append(self._state.intdigest())
            self._state.reset()
            self._fill = 0
        return self.crcs


class CorruptCacheFile(FetchError):
    """A disk-cache file failed verification or could not be read; `cache_path` names it.

    Raised to the caller only when the shard cannot be read from the origin instead (the origin
    failed, or its bytes differ from those already delivered from the cache file).
    """

    def __init__(
        self, message: str, *, cache_path: Optional[str] = None, url: Optional[str] = None, reason: str = "",
        offset: Optional[int] = None,
    ) -> None:
        if cache_path is None:  # torch rebuilding a worker's error from its text: CorruptCacheFile(text)
            where = worker_where(message) or {}
            cache_path, reason = where.get("cache_path"), reason or where.get("reason") or ""
        self.cache_path = cache_path
        self.reason = reason or message
        # file offset of the first bad block: the bytes before it were handed out (or, for a read
        # that began mid-shard, lie before its first checked block and were never parsed)
        self.bad_offset = offset
        self.source: Optional["VerifiedFile"] = None  # set by the reader that found the corruption
        super().__init__(message, url=url)

    def __reduce__(self):
        return (_rebuild, (self.message, self.cache_path, self.url, self.reason, self.bad_offset), notes_state(self))


def _rebuild(message, cache_path, url, reason, offset):
    return CorruptCacheFile(message, cache_path=cache_path, url=url, reason=reason, offset=offset)


class VerifiedFile:
    """A disk hit: an open committed file, read in blocks that are each checked against the
    record before they are yielded (an open file survives eviction by unlink while we read).

    `ident` is the file's (st_dev, st_ino): eviction after a failure removes the path only if it
    still is this file, never a replacement another process committed meanwhile. After a failure
    `close` keeps the file open until `release`, so that its inode number cannot be reused by a
    replacement before that check.
    """

    def __init__(self, tier, path: str, f, record: ShardRecord, ident: Tuple[int, int], url: str) -> None:
        self.tier, self.path, self.file, self.record, self.ident, self.url = tier, path, f, record, ident, url
        self.held = False
        self.start = 0  # where iteration begins: a block boundary (`skip_blocks`)
        self.checked = 0  # bytes checked in place by `check` (a mapped read)

    @property
    def size(self) -> int:
        return self.record.size

    def skip_blocks(self, digests: Sequence[int]) -> bool:
        """Begin after the blocks whose `digests` were handed out already (from another copy of
        the same shard); False when this file's record disagrees about them (the shard changed)."""
        crcs = self.record.crcs or ()
        if len(digests) > len(crcs) or list(crcs[: len(digests)]) != list(digests):
            return False
        self.start = min(self.record.size, len(digests) * self.record.block_size)
        return True

    def __iter__(self):
        read, digest = self.file.read, block_digest
        size, block_size, crcs = self.record.size, self.record.block_size, self.record.crcs
        offset = self.start
        index = offset // block_size
        if offset:
            self.file.seek(offset)
        while offset < size:
            want = min(block_size, size - offset)
            try:
                block = read(want)
            except OSError as exn:
                raise self.failed(offset, f"read error: {exn}") from exn
            if len(block) != want:
                raise self.failed(offset, f"the file ends at byte {offset + len(block)}, {size} were recorded")
            if digest(block) != crcs[index]:  # type: ignore[index]
                raise self.failed(offset, f"digest mismatch in bytes {offset}-{offset + want - 1}")
            yield block
            offset += want
            index += 1

    def check_from(self, offset: int) -> None:
        """Make `check` begin at the block holding byte `offset` instead of byte 0, for a reader
        that parses nothing before `offset` (a resume mid-shard): the blocks before that one are
        never checked, so none of their bytes may be parsed. Call it before the first `check`."""
        if self.checked:
            raise ValueError(f"check_from({offset}) after bytes 0-{self.checked - 1} were checked")
        self.checked = min(self.record.size, offset - offset % self.record.block_size)

    def check(self, view, stop: int) -> None:
        """Check the blocks of a memory map of this file (`view`) up to the one holding byte
        `stop - 1`, in order from byte 0 (or from `check_from`'s block), before the caller parses
        any of them (`_shard.members.mapped_member_batches`).

        Raises CorruptCacheFile at the first bad block (its `bad_offset`: how far the map was good).
        """
        size, block_size, crcs = self.record.size, self.record.block_size, self.record.crcs
        offset = first = self.checked
        if len(view) != size:
            raise self.failed(offset, f"the file has {len(view)} bytes, {size} were recorded")
        fd = self.file.fileno() if self.file is not None else None
        try:
            while offset < stop:
                end = min(size, offset + block_size)
                # Touching a mapped page past the file's end is a SIGBUS, which kills the process:
                # a file cut short in place (by someone else) is seen here, block by block.
                now = os.fstat(fd).st_size if fd is not None else end
                if now < end:
                    raise self.failed(offset, f"the file shrank to {now} bytes while it was read")
                if block_digest(view[offset:end]) != crcs[offset // block_size]:  # type: ignore[index]
                    raise self.failed(offset, f"digest mismatch in bytes {offset}-{end - 1}")
                offset = self.checked = end
        finally:
            if offset > first:
                self.tier.counters.add(bytes_served=offset - first)

    def failed(self, offset: int, reason: str) -> CorruptCacheFile:
        exn = CorruptCacheFile(
            f"corrupt cache file {self.path}: {reason}", cache_path=self.path, url=self.url, reason=reason,
            offset=offset,
        )
        exn.source = self
        self.held = True
        return exn

    def close(self) -> None:
        if self.file is not None and not self.held:
            self.file.close()
            self.file = None
            self.tier._reader_done(self.path)

    def release(self) -> None:
        """Close a file that `close` kept open after a failure."""
        self.held = False
        self.close()


class Resume:
    """Continue a shard after `delivered` bytes (whole blocks, with these `digests`) were handed
    out from another copy: a cached file that then failed, or another process's write in progress.

    A re-read (from the origin, or from a copy another process cached meanwhile) starts at byte
    0: `take` drops the first `delivered` bytes after checking them against the digests of the
    blocks already handed out, so the consumer sees one seamless, correct stream, or an error
    when the shard changed at the origin.
    """

    def __init__(
        self, delivered: int, digests: Sequence[int], block_size: int, *, url: Optional[str] = None,
        failure: Optional[CorruptCacheFile] = None, keep: bool = False,
    ) -> None:
        self.failure, self.url = failure, url
        self.left = delivered
        self._expected = list(digests[: delivered // block_size])
        self._digest = BlockDigest(block_size)
        # keep: hand the bytes on instead of dropping them, each block once it is checked (for a
        # reader that parses the shard again from its start and drops what it delivered itself)
        self._keep: Optional[List] = [] if keep else None

    @classmethod
    def after(cls, failure: CorruptCacheFile, keep: bool = False) -> "Resume":
        """Go on after the blocks of a corrupt cached file before its bad one: those checked (and
        those a read that began mid-shard skipped), each compared again with the record."""
        record = failure.source.record  # type: ignore[union-attr]
        return cls(failure.bad_offset or 0, record.crcs or (), record.block_size, url=failure.url, failure=failure,
                   keep=keep)

    def take(self, chunk):
        """The part of `chunk` to hand on: past the bytes already delivered, or (keep) the blocks
        of them checked so far (maybe empty)."""
        if self._keep is not None:
            return self._take_kept(chunk)
        n = len(chunk)
        if n <= self.left:
            self._digest.update(chunk)
            self.left -= n
            rest = b""
        else:
            self._digest.update(memoryview(chunk)[: self.left])
            rest = chunk[self.left :]
            self.left = 0
        if not self.left:
            self.check_done()
        return rest

    def _take_kept(self, chunk):
        keep, n = self._keep, len(chunk)
        head, rest = (chunk, b"") if n <= self.left else (chunk[: self.left], chunk[self.left :])
        self.left -= len(head)
        keep.append(head)  # type: ignore[union-attr]
        checked = len(self._digest.crcs)
        self._digest.update(head)
        if len(self._digest.crcs) > checked or not self.left:
            if not self.left:
                self.check_done()
            elif self._digest.crcs != self._expected[: len(self._digest.crcs)]:
                self._changed()
            held = b"".join(keep)  # type: ignore[arg-type]
            cut = len(held) if not self.left else len(held) - self._digest._fill
            keep[:] = [held[cut:]] if cut < len(held) else []  # type: ignore[index]
            return held[:cut] + rest if rest else held[:cut]
        return rest

    def check_done(self) -> None:
        """Raise unless exactly the delivered bytes were seen again, unchanged."""
        if not self.left and self._digest.finish() == self._expected:
            return
        self._changed()

    def _changed(self) -> None:
        failure = self.failure
        if failure is None:
            raise FetchError(
                "the shard read again differs from the bytes already delivered from another process's copy in the "
                "cache (did it change at the origin?)", url=self.url,
            )
        raise CorruptCacheFile(
            f"corrupt cache file {failure.cache_path} ({failure.reason}) was evicted after {failure.bad_offset} "
            "bytes of it had been delivered (or skipped by a resume), and the shard read again differs in those "
            "bytes (did it change at the origin?)",
            cache_path=failure.cache_path, url=failure.url, reason=failure.reason, offset=failure.bad_offset,
        )
