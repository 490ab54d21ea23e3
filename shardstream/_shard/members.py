"""The members of a shard, from its bytes: the I/O side of the sans-IO tar reader.

Local uncompressed shards are memory-mapped and parsed in place (`TarReader.feed_view`), so each
payload is copied exactly once, from the page cache into its `bytes`. Everything else (gzip,
pipes, remote streams, caches) is fed to the reader chunk by chunk.
"""

from __future__ import annotations

import logging
import mmap
import os
import stat
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional

from .._base.errors import FetchError, ShardNotFound, ShardStreamError, redact_url
from .._tar.codecs import MAGIC_BYTES, sniff
from .._base.malloc import tune_malloc
from .._base.counters import Counters
from .._tar.reader import TarMember, TarReader

__all__ = ["SourceStats", "chunk_member_batches", "is_compressed_file", "iter_members", "mapped_member_batches", "member_batches"]


class SourceStats(Counters):
    """Bytes, shards, samples and errors read by a source stage, and the retries, Range resumes
    and waits for bytes (`wait_us`: 0 for local shards) of the remote streams it opened (the
    engine reports them)."""

    FIELDS = ("bytes", "shards", "samples", "errors", "retries", "resumes", "wait_us")

logger = logging.getLogger(__name__)

WINDOW = 8 << 20  # bytes parsed per step of a mapped file: bounds the members held at once
_PAGE = mmap.PAGESIZE


_told: set = set()  # shards already warned about in this process (once each, not every epoch)


def _closed(reader: TarReader, url: Optional[str]) -> List[TarMember]:
    """reader.close(), saying so when the archive ended without its end-of-archive blocks."""
    members = reader.close()
    if reader.unterminated is not None and url not in _told:
        if url is not None and len(_told) < 10_000:
            _told.add(url)
        logger.warning(
            "%s ends at byte %d without the tar end-of-archive blocks: it may be truncated there, and its last "
            "sample may lack members (tar, tarfile and ShardWriter end every shard with them; webdataset reads such a "
            "shard the same way)", "a tar stream" if url is None else redact_url(url), reader.unterminated)
    return members


def iter_members(
    chunks: Iterable[bytes], url: Optional[str] = None, others: Optional[Callable[[str, str, int], None]] = None,
) -> Iterator[TarMember]:
    """The regular members of a shard given as byte chunks (raises FormatError); `others` hears
    of its links, devices and FIFOs (see TarReader)."""
    reader = TarReader(url, others=others)
    for chunk in chunks:
        yield from reader.feed(chunk)
        while reader.backlog:  # (a compressed chunk comes out a step at a time)
            yield from reader.feed(b"")
    yield from _closed(reader, url)
    reader.close()  # (raises an error kept back behind the last member)


def chunk_member_batches(
    chunks: Iterable[bytes], url: str, stats: Optional[SourceStats] = None, start_offset: int = 0,
    info: Optional[Dict[str, Any]] = None,
) -> Iterator[List[TarMember]]:
    """Lists of members, one per chunk fed (many lists may be empty); chunks begin at start_offset.
    `info["compressed"]` tells whether the shard turned out to be gzip."""
    reader = TarReader(url, start_offset=start_offset)
    feed = reader.feed
    sized = hasattr(chunks, "size")  # a ChunkStream learns the object's size from the response
    try:
        for chunk in chunks:
            if sized and chunks.size is not None:  # type: ignore[attr-defined]
                reader.limit(chunks.size)  # type: ignore[attr-defined]
                sized = False
            if stats is not None:
                stats.add(bytes=len(chunk))
            members = feed(chunk)
            if info is not None:
                info["compressed"] = reader.compressed
            yield members
            while reader.backlog:  # (a compressed chunk comes out a step at a time)
                yield feed(b"")
        yield _closed(reader, url)
        reader.close()  # (raises an error kept back behind the last member)
    except FetchError as exn:  # the transfer broke: say inside which member, as format errors do
        _where_it_broke(exn, reader)
        raise exn.with_location(member=reader.pending_member)
    except ShardStreamError as exn:
        _where_it_broke(exn, reader)
        raise
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()


def mapped_member_batches(
    path: str, url: str, stats: Optional[SourceStats] = None, start_offset: int = 0, payloads: bool = True,
    *, fd: Optional[int] = None, check: Optional[Callable[[Any, int], None]] = None, window: int = WINDOW,
) -> Iterator[List[TarMember]]:
    """Lists of members of an uncompressed local shard, parsed in place from a memory map.

    Headers and small payloads are copied out of the map; large payloads are read with os.pread,
    which releases the GIL, so several shards can be read in parallel threads. With
    `payloads=False` the members' data is empty and only header pages are read (a sample count
    of a local shard costs one page per member, not the shard's size).

    `fd`: read this open file (the caller keeps it open and closes it) instead of `path`.
    `check(view, stop)`: called before any byte of the map below `stop` is parsed, with the map's
    view (a disk-cache hit verifies its blocks there; raising stops the batches). A checked map's
    large payloads are copied out of the map too (holding the GIL), not read with os.pread: the
    check has read every page already, and on the build machine os.pread of 462 MB of page cache
    took 0.22-0.30 s of system time where reading it through a map took 0.01-0.03 s. A fresh
    process's pass over a filled disk cache went from 10,383 to 11,343 samples/s (medians of 30
    alternating processes; 12,606 over the local files). `window`: bytes parsed per step (a
    checked map: small, so that the bytes just checked are still in the CPU's cache).
    """
    step = window
    owned = fd is None
    if owned:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError as exn:
            raise ShardNotFound("shard not found", url=url) from exn
        except OSError as exn:
            raise FetchError(f"cannot open shard: {exn}", url=url) from exn
    assert fd is not None
    mapped = view = None
    reader: Optional[TarReader] = None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise FetchError("cannot open shard: it is a directory (name its shards: the folder with a trailing '/', a glob, "
                             "a brace pattern or a list)", url=url)
        size = info.st_size
        reader = TarReader(url, start_offset=start_offset, payloads=payloads, size=size)
        if size == 0 or start_offset >= size:
            yield reader.close()  # raises "empty file"
            return
        mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        view = memoryview(mapped)
        if hasattr(mapped, "madvise"):  # a header walk must not read ahead into the payloads
            mapped.madvise(mmap.MADV_SEQUENTIAL if payloads else mmap.MADV_RANDOM)
        pos = start_offset
        released = start_offset - start_offset % _PAGE
        while pos < size and not reader.finished:
            window = step
            while True:
                stop = min(size, pos + window)
                if check is not None:
                    check(view, stop)
                else:
                    _not_shrunk(fd, stop, size, url)
                members, consumed = reader.feed_view(
                    view[pos:stop], read_range=None if check is not None else _preader(fd, pos, url))
                if consumed or stop == size:
                    break
                window *= 2  # a member larger than the window
            if consumed == 0:
                break  # the rest is an incomplete member: feed() + close() report it
            pos += consumed
            if stats is not None:
                stats.add(bytes=consumed)
            yield members
            # Drop the pages behind us from this process's mapping: memory stays bounded by the
            # window, not the shard (the page cache keeps them for the next reader).
            done = pos - pos % _PAGE
            if hasattr(mapped, "madvise") and done - released >= WINDOW:
                mapped.madvise(mmap.MADV_DONTNEED, released, done - released)
                released = done
        stop = min(size, reader.tail_end(pos)) if reader.finished else size  # after the archive: a stray header?
        if check is not None:
            check(view, stop)
        else:
            _not_shrunk(fd, stop, size, url)
        if reader.finished:  # (the tail scanned in place, not copied whole first)
            reader.feed_view(view[pos:stop])
            yield _closed(reader, url)
        else:
            rest = view[pos:stop].tobytes() if pos < stop else b""
            yield reader.feed(rest) + _closed(reader, url)
        reader.close()  # (raises an error kept back behind the last member)
    except ShardStreamError as exn:
        if reader is not None:
            _where_it_broke(exn, reader)
        raise
    finally:
        if view is not None:
            view.release()
        if mapped is not None:
            try:
                mapped.close()
            except BufferError:  # a view is still referenced (e.g. by a traceback): GC closes it
                pass
        if owned:
            os.close(fd)


def _where_it_broke(exn: ShardStreamError, reader: TarReader) -> None:
    """Tell `exn` how far the shard was read whole (see ShardStreamError.pending, archive_end):
    the samples before that point are handed out before it is raised."""
    if exn.pending is None:
        exn.pending = reader.pending_header
    if exn.archive_end is None and reader.finished:
        exn.archive_end = reader.offset


def _not_shrunk(fd: int, stop: int, size: int, url: str) -> None:
    """Raise when the mapped file no longer reaches `stop`: touching a mapped page past a file's
    end kills the process (SIGBUS). Checked before each window is parsed; a file cut while that
    window is being parsed is not caught."""
    now = os.fstat(fd).st_size
    if now < stop:
        raise FetchError(f"the file shrank from {size} to {now} bytes while it was read", url=url, offset=now)


def _preader(fd: int, base: int, url: str) -> Callable[[int, int], bytes]:
    def read_range(start: int, stop: int) -> bytes:
        data = os.pread(fd, stop - start, base + start)
        if len(data) != stop - start:
            raise FetchError(f"file shrank while reading (short read at {base + start})", url=url)
        return data

    return read_range


def is_compressed_file(path: str) -> bool:
    """Whether the file at `path` starts like a gzip, bzip2 or xz stream (False if unreadable):
    such a shard is streamed through its decompressor, never memory-mapped, and its member
    offsets are in the decompressed stream."""
    try:
        with open(path, "rb") as f:
            head = f.read(MAGIC_BYTES)
    except OSError:
        return False
    return sniff(head)[0] is not None


def member_batches(
    url: str,
    local_path: Optional[str],
    open_chunks: Callable[[str, int], Iterable[bytes]],
    stats: Optional[SourceStats] = None,
    start_offset: int = 0,
    info: Optional[Dict[str, Any]] = None,
) -> Iterator[List[TarMember]]:
    """Lists of members of shard `url` from byte `start_offset` (a header of an uncompressed
    archive): mapped when it is a local uncompressed file, else fed in chunks. `info`, when
    given, gets "compressed": whether member offsets can be used to seek in the shard's bytes."""
    tune_malloc()
    if local_path is not None and not is_compressed_file(local_path):
        if info is not None:
            info["compressed"] = False
        return mapped_member_batches(local_path, url, stats, start_offset)
    return chunk_member_batches(open_chunks(url, start_offset), url, stats, start_offset, info)
