"""A shard shared while it is being written: the writer's thread and progress log, and followers.

The process that holds a URL's claim (`DiskTier.try_claim`) writes the shard to its temp file
`.<name>.<host>.<pid>.<rand>.tmp`. Its `BlockWriter` thread does the writing and the digests off
the reader's path, and appends each full block's digest to the progress log beside the temp file
(`.<...>.<rand>.sums.tmp`: a 16-byte header, then one 8-byte digest per block) once the block's
bytes are written. Other processes that want the shard meanwhile `follow` the write: they read
only blocks whose digest is in the log, and check each before they hand it out, so they never see
a byte the writer has not written and checked, and they need not wait for the whole shard.

The writer thread also commits (`DiskWriter.commit_soon`: the last block, the digest record, the
rename) and only then lets the claim go, while the reader moves on to its next shard; this
process's `lookup` of the URL, and the tier's `settle`, wait for such a commit.

A follower goes on from the committed file once the writer renamed it into place. When the writer
is gone without committing (its claim is free again: it failed, or was killed), the follower takes
the claim and fetches the shard itself; when the writer makes no progress for `stall_timeout`
(its consumer is stuck, say), the follower streams the shard from the origin without caching.
Either way it continues after the bytes it already handed out (`Resume`). Every wait is a short
sleep in a loop bounded by those timeouts.
"""

from __future__ import annotations

import atexit
import collections
import ctypes
import functools
import glob
import logging
import os
import struct
import sys
import threading
import time
import weakref
from typing import Any, Callable, List, NamedTuple, Optional, Tuple

from .check import BlockDigest, block_digest
from .naming import _unlink, cache_file_name
from .._base.errors import FetchError, redact_url

__all__ = [
    "BlockWriter", "DiskWriter", "FollowEnd", "PendingCommits", "follow", "open_progress_log", "preallocate",
    "progress_log_path",
]

logger = logging.getLogger(__name__)

_HEADER = struct.Struct(">8sQ")  # magic, block size
_MAGIC = b"shsums3\n"
_DIGEST = struct.Struct(">Q")
_IOV_MAX = min(1024, os.sysconf("SC_IOV_MAX")) if hasattr(os, "sysconf") else 16
WRITE_BYTES = 256 << 10  # bytes per write call at most (why: _write_chunks)
MAX_QUEUED = 16 << 20  # bytes handed to the writer thread but not yet written: the reader waits beyond
WRITE_STALL = 60.0  # seconds the writer thread may take no data before the write is given up
PREALLOCATE_SPARE = 256 << 20  # bytes of free disk a preallocation leaves, at least
UNSTARTED_WAIT = 1.0  # seconds a follower waits on a claim whose write has not begun before `on_stuck`
_RECHECK = 1.0  # a follower without news for this long looks at its deadlines again


def progress_log_path(temp: str) -> str:
    """The progress log of the temp file `temp` (which ends in ".tmp")."""
    return temp[: -len(".tmp")] + ".sums.tmp"


def open_progress_log(temp: str, block_size: int) -> int:
    """Create `temp`'s progress log (exclusively) and return its fd, header written."""
    path = progress_log_path(temp)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        os.write(fd, _HEADER.pack(_MAGIC, block_size))
    except BaseException:  # (a full disk: the file was made, its header could not be written)
        os.close(fd)
        _unlink(path)
        raise
    return fd


def _write_chunks(fd: int, chunks: List, nbytes: int) -> None:
    """Write `chunks` (`nbytes` in all) in order, in writev calls of at most WRITE_BYTES each
    (a chunk larger than that goes alone).

    Why not one writev for all: on this project's VMs (Linux 6.18, ext4, a balloon that hands free
    memory back to the host), 480 MB written in 1 MiB calls took 0.13-1.5 s of system time (5 of 9
    runs over 0.5 s), in 256 or 512 KiB calls 0.12-0.18 s (12 of 12): a large write gets large
    page-cache folios, from the high-order free blocks that the balloon has handed back and the
    host must fault in again (our reading; the measurements are what we have). A syscall per
    256 KiB costs nothing measurable anywhere."""
    group: List = []
    size = 0
    for chunk in chunks:
        if group and (size + len(chunk) > WRITE_BYTES or len(group) == _IOV_MAX):
            _write_group(fd, group, size)
            group, size = [], 0
        group.append(chunk)
        size += len(chunk)
    if group:
        _write_group(fd, group, size)


def _write_group(fd: int, group: List, size: int) -> None:
    done = os.writev(fd, group)
    if done == size:
        return
    view = memoryview(b"".join(group))[done:]  # a short write (a full disk, a signal): the rest in a loop
    while view:
        view = view[os.write(fd, view) :]


_FALLOC_FL_KEEP_SIZE = 1
_fallocate: Any = None  # libc's fallocate, looked up on first use (False: not there)


def preallocate(fd: int, offset: int, length: int) -> bool:
    """Reserve `length` bytes of disk for `fd` from `offset`, past its end, without changing its
    length (Linux `fallocate` with FALLOC_FL_KEEP_SIZE: followers read the length as the bytes
    written). ext4 then maps the blocks once, instead of a delayed-allocation reservation for every
    page written: 480 MB written in 1 MiB batches took 0.063 s of system time against 0.092 s here.
    Where the platform or the file system lacks it, nothing happens (False). Never `posix_fallocate`:
    it changes the length, and glibc emulates it by writing a byte per block."""
    global _fallocate
    if _fallocate is None:
        function: Any = None
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                function = getattr(libc, "fallocate64", None)  # (64-bit offsets on every ABI)
                if function is None and ctypes.sizeof(ctypes.c_long) == 8:
                    function = libc.fallocate  # (a libc without the LFS64 names: off_t is 64-bit here)
            except (OSError, AttributeError):
                function = None
        if function is not None:
            function.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
            function.restype = ctypes.c_int
        _fallocate = function or False
    if not _fallocate or length <= 0:
        return False
    return _fallocate(fd, _FALLOC_FL_KEEP_SIZE, offset, length) == 0


def _fits(fd: int, length: int) -> bool:
    """Whether `length` more bytes leave the file system of `fd` PREALLOCATE_SPARE bytes free: a size
    an origin announces must not take the disk that other writers and the cache's records need."""
    try:
        stats = os.fstatvfs(fd)
    except OSError:
        return False
    return length + PREALLOCATE_SPARE <= stats.f_bavail * stats.f_frsize


def _publish(log_fd: int, index: int, digest: int) -> None:
    """Append a written block's digest to the progress log that followers read."""
    os.write(log_fd, _DIGEST.pack(digest))


class BlockWriter:
    """Writes a shard's chunks to its temp file from a thread, and publishes each full block's
    digest in the progress log as soon as the block is written.

    `put` hands chunks over (the reader waits only while MAX_QUEUED bytes are queued); `reserve`
    says how long the shard will be, so that the thread preallocates its blocks before the next
    write (and gives back what was not written when it finishes); `finish` waits for the rest and
    returns the digest, or None when a write failed (`error` says why); `cancel` drops what is
    queued. Both join the thread.

    The thread is woken once a block's worth of bytes is queued, not for every chunk: a block is
    what a follower waits for anyway, and one write per block takes ~460 wake-ups for 463 MB of
    shards where a wake-up per network chunk took ~6,500.
    """

    def __init__(self, fd: int, log_fd: int, block_size: int) -> None:
        self.fd, self.log_fd = fd, log_fd
        self.error: Optional[OSError] = None
        # (the log's fd, not a bound method: a digest holding its writer would be a cycle for the collector)
        self.digest = BlockDigest(block_size, on_block=functools.partial(_publish, log_fd))
        self._wake = min(block_size, MAX_QUEUED // 2)  # (a put blocks at MAX_QUEUED: wake before)
        self._queue: collections.deque = collections.deque()
        self._queued = 0
        self.written = 0  # bytes written (by the thread)
        self._reserve = self._tried = 0  # bytes to preallocate up to; preallocation tried up to
        self._cond = threading.Condition()
        self._closing = self._cancelled = False
        self._then: Optional[Callable[[Optional[BlockDigest]], None]] = None
        self._exited = False
        self._thread = threading.Thread(target=self._run, name="shardstream-cache-writer", daemon=True)
        self._thread.start()

    def put(self, chunks: List[bytes], nbytes: int) -> bool:
        """Queue `chunks` (immutable bytes, `nbytes` in all) for writing; False once writing failed
        (or has not moved for WRITE_STALL seconds: a hung cache disk must not hang the read)."""
        with self._cond:
            queued, since = self._queued, time.monotonic()
            while self._queued >= MAX_QUEUED and self.error is None:
                self._cond.wait(1.0)  # the thread frees room as it writes
                if self._queued != queued:
                    queued, since = self._queued, time.monotonic()
                elif time.monotonic() - since >= WRITE_STALL:
                    self.error = TimeoutError(f"the cache disk took no data for {WRITE_STALL:g} s")
            if self.error is not None:
                return False
            self._queue.extend(chunks)
            self._queued += nbytes
            if self._queued >= self._wake:
                self._cond.notify_all()
        return True

    def reserve(self, size: int) -> None:
        """The shard will be `size` bytes long: preallocate them before the next write."""
        with self._cond:
            self._reserve = max(self._reserve, size)

    def _run(self) -> None:
        try:
            self._write_queued()
        finally:
            with self._cond:
                self._exited = True
                then, self._then = self._then, None  # (it holds the DiskWriter that holds us)
            if then is not None:
                then(None if self.error is not None else self.digest)

    def _write_queued(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while self._queued < self._wake and not self._closing and not self._cancelled:
                    cond.wait()
                if self._cancelled:
                    return
                if not self._queue:
                    break
                batch = list(self._queue)  # everything queued: one writev, one wake-up
                self._queue.clear()
                reserve = self._reserve
            nbytes = sum(len(chunk) for chunk in batch)
            try:
                if reserve > self._tried:  # (once per size said: a file system without it says no once)
                    self._tried = reserve
                    if reserve > self.written + nbytes and _fits(self.fd, reserve - self.written):
                        preallocate(self.fd, self.written, reserve - self.written)
                _write_chunks(self.fd, batch, nbytes)
                self.written += nbytes
                for chunk in batch:
                    self.digest.update(chunk)  # after the write: a published digest covers bytes on disk
            except OSError as exn:
                with cond:
                    self.error = exn
                    self._queue.clear()
                    self._queued = 0
                    cond.notify_all()
                return
            with cond:
                self._queued -= nbytes
                cond.notify_all()
        if self._tried > self.written:  # (shorter than its origin said; a failed try may have kept some)
            try:
                os.ftruncate(self.fd, self.written)  # gives back the preallocated blocks past the end
            except OSError as exn:
                self.error = exn

    def finish(self) -> Optional[BlockDigest]:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(WRITE_STALL)
        if self.alive and self.error is None:
            self.error = TimeoutError(f"the cache disk took no data for {WRITE_STALL:g} s")
        return None if self.error is not None else self.digest

    def finish_soon(self, then: Callable[[Optional[BlockDigest]], None]) -> None:
        """`finish` without waiting: the thread writes what is queued, then calls `then` with the
        digest (None when a write failed) as its last act. The reader goes on meanwhile."""
        with self._cond:
            if not self._exited:
                self._then = then
                self._closing = True
                self._cond.notify_all()
                return
        then(None if self.error is not None else self.digest)  # it stopped already (a failed write)

    @property
    def alive(self) -> bool:
        """Whether the thread still runs (only after a write hung in the kernel past WRITE_STALL),
        as seen from another thread: the thread itself, committing, has done its writes."""
        return self._thread.is_alive() and not self._exited and threading.current_thread() is not self._thread

    def cancel(self) -> None:
        with self._cond:
            self._cancelled = True
            self._queue.clear()
            self._queued = 0
            self._cond.notify_all()
        self._thread.join(WRITE_STALL)  # (a write hung in the kernel: the daemon thread is left to it)


class _Pending:
    """One commit on a writer thread: `then` runs once, when it is done or given up."""

    def __init__(self, then: Callable[[], None]) -> None:
        self.event = threading.Event()
        self.given_up = False
        self._then: Optional[Callable[[], None]] = then
        self._lock = threading.Lock()

    def run_then(self) -> None:
        with self._lock:
            then, self._then = self._then, None
        if then is not None:
            then()


class PendingCommits:
    """The commits this process's writer threads have yet to finish, by URL (`commit_soon`).

    A commit still going after a waiter's `timeout` (a cache disk that hangs) is given up: its
    `then` runs (the claims go) and later waiters no longer wait for it. If its thread comes back
    before the commit began, it discards the file; one that hung inside the commit finishes it
    (the file is whole and checked; another process's copy would replace it atomically). So a
    hung disk costs one wait of WRITE_STALL, as a synchronous commit did.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict = {}  # url -> [_Pending, ...]
        _EVERY.add(self)

    def add(self, url: str, then: Callable[[], None]) -> _Pending:
        pending = _Pending(then)
        with self._lock:
            self._pending.setdefault(url, []).append(pending)
        return pending

    def done(self, url: str, pending: _Pending) -> None:
        """The commit ended (or was given up): run its `then` if nobody did, wake the waiters."""
        try:
            pending.run_then()
        finally:
            with self._lock:
                entries = self._pending.get(url, [])
                if pending in entries:
                    entries.remove(pending)
                if not entries:
                    self._pending.pop(url, None)
            pending.event.set()

    def wait(self, url: Optional[str] = None, timeout: Optional[float] = None) -> bool:
        """Wait until the commits of `url` (of every URL when None) are done: False when one was
        still going after `timeout` seconds (WRITE_STALL when None) and was given up."""
        if timeout is None:
            timeout = WRITE_STALL
        deadline = time.monotonic() + timeout
        with self._lock:
            if url is None:
                found = [(u, p) for u, entries in self._pending.items() for p in entries]
            else:
                found = [(url, p) for p in self._pending.get(url, ())]
        settled = True
        for u, pending in found:
            if not pending.event.wait(max(0.0, deadline - time.monotonic())):
                settled = False
                pending.given_up = True
                logger.warning("the cache's commit of %s is not done after %g s: giving it up", redact_url(u), timeout)
                self.done(u, pending)
        return settled


_EVERY: "weakref.WeakSet[PendingCommits]" = weakref.WeakSet()


@atexit.register
def _settle_at_exit() -> None:
    """Shards read whole are committed before the interpreter stops the writer threads (an
    iterator dropped mid-pass never reached its `settle`); a hung disk holds exit up 10 s."""
    deadline = time.monotonic() + 10.0
    for pending in list(_EVERY):
        pending.wait(None, max(0.0, deadline - time.monotonic()))


class DiskWriter:
    """Writes a shard to a private temp file (from a `BlockWriter` thread, publishing its progress
    for other processes); `commit` renames it into place, `abort` deletes it."""

    def __init__(self, tier: Any, url: str, temp: str, fd: int, log_fd: int) -> None:
        self.tier, self.url, self.temp = tier, url, temp
        self.size = 0
        self.live = True
        self._fds = [fd, log_fd]
        self.thread = BlockWriter(fd, log_fd, tier.chunk_size)  # digests from the chunks as they are written

    @property
    def block_size(self) -> int:
        """The bytes of a digest block: what a follower in another process waits for."""
        return self.tier.chunk_size

    def write(self, chunk: bytes) -> None:
        self.write_many([chunk], len(chunk))

    def reserve(self, size: int) -> None:
        """The shard will be `size` bytes long (its origin said so): preallocate it on disk, or
        give up now when it can never fit."""
        if not self.live:
            return
        if self.tier.max_bytes is not None and size > self.tier.max_bytes:
            self.abort()
        else:
            self.thread.reserve(size)

    def write_many(self, chunks: List[bytes], nbytes: int) -> None:
        """Append `chunks` (immutable bytes, `nbytes` in all)."""
        if not self.live:
            return
        self.size += nbytes
        if self.tier.max_bytes is not None and self.size > self.tier.max_bytes:
            self.abort()  # can never fit: stop paying for the copy
            return
        if not self.thread.put(chunks, nbytes):
            self._failed(self.thread.error)

    def _failed(self, exn) -> None:  # a full or broken cache disk must not fail the read
        logger.warning("cache write failed, not caching %s: %s", self.temp, exn)
        self.tier.counters.add(errors=1)
        self.abort()

    def _close(self) -> Optional[OSError]:
        error = None
        if self.thread.alive:  # hung in a write: closing its fd could let the number be reused under it
            self._fds = []
            return None
        for fd in self._fds:
            try:
                os.close(fd)
            except OSError as exn:
                error = error or exn
        self._fds = []
        return error

    def commit(self) -> bool:
        """Wait for the writes, then rename the file into place; True when it was committed."""
        if not self.live:
            return False
        self.live = False
        return self._commit(self.thread.finish())

    def commit_soon(self, then: Callable[[], None]) -> None:
        """`commit` off the caller's thread: the writer thread commits once the queued bytes are
        written, then calls `then` (the caller hands its claims over that way, so that nobody is
        let in before the file is in place). The tier's `lookup` of the URL, and `settle`, wait
        for it meanwhile; a reader goes on to the next shard."""
        if not self.live:
            then()
            return
        self.live = False
        pending = self.tier.pending.add(self.url, then)

        def committed(digest: Optional[BlockDigest]) -> None:
            try:
                if pending.given_up:  # a waiter gave up on us: its claims are gone, keep nothing
                    self.thread.error = self.thread.error or TimeoutError("the commit was given up")
                self._commit(digest)
            finally:
                self.tier.pending.done(self.url, pending)

        self.thread.finish_soon(committed)

    def _commit(self, digest: Optional[BlockDigest]) -> bool:
        error = self._close() or self.thread.error
        if digest is None or error is not None:
            logger.warning("cache write failed, not caching %s: %s", self.temp, error)
            self.tier.counters.add(errors=1, discarded=1)
            _unlink(self.temp)
            _unlink(progress_log_path(self.temp))
            return False
        try:
            return self.tier._commit(self.url, self.temp, self.size, digest)
        finally:
            _unlink(progress_log_path(self.temp))  # after the rename: followers then find the committed file

    def abort(self) -> None:
        if self.live:
            self.live = False
            self.thread.cancel()
            self._close()
            _unlink(self.temp)
            _unlink(progress_log_path(self.temp))
            self.tier.counters.add(discarded=1)


class FollowEnd(NamedTuple):
    """How following a write ended. kind: "committed" (`source` is the committed file, already set
    to go on after the delivered blocks), "claimed" (`claim`: the writer is gone, fetch it
    ourselves), or "alone" (stalled or timed out: fetch it without caching). `digests` are those
    of the blocks handed out (each `block_size` long)."""

    kind: str
    digests: List[int]
    source: Any = None
    claim: Any = None


def _live_logs(tier, url: str) -> List[Tuple[float, str]]:
    """(mtime, path) of the progress logs of `url`'s writes in progress, newest first."""
    pattern = os.path.join(glob.escape(tier.cache_dir), glob.escape(f".{cache_file_name(url)}") + ".*.sums.tmp")
    found = []
    for path in glob.glob(pattern):
        try:
            found.append((os.stat(path).st_mtime, path))
        except OSError:
            pass
    return sorted(found, reverse=True)


def follow(tier, url: str, on_stuck: Optional[Callable[[], None]] = None):
    """Yield `url`'s blocks from another process's write in progress (each checked against the
    digest that process published), then from the committed file. Returns a `FollowEnd`.

    A claim taken ahead of reading (`ShardCache.prepare`) has no write yet until its holder's
    reader gets to it; two processes reading in different orders could each wait for such a claim
    of the other's. So after UNSTARTED_WAIT seconds on a write that has not begun, `on_stuck()` is
    called once: it gives back this process's own claims that have not begun either, which lets
    the other process take them and go on (and may let us take this one).

    Raises FetchError when a copy disagrees with the blocks already handed out (the shard changed).
    """
    digests: List[int] = []
    block_size = tier.chunk_size
    started = last_progress = time.monotonic()
    poll = min(tier.poll_interval, 0.01)
    unstarted_since: Optional[float] = None
    while True:
        source = tier.lookup(url)
        if source is not None:
            if digests and (source.record.block_size != block_size or not source.skip_blocks(digests)):
                source.close()
                raise FetchError("the committed cache file differs from the bytes already delivered from its write in "
                                 "progress (did the shard change at the origin?)", url=url)
            return FollowEnd("committed", digests, source=source)
        claim = tier.try_claim(url)
        if claim is not None:
            return FollowEnd("claimed", digests, claim=claim)
        if tier.unlockable(url):  # no lock file can be made: nobody writes it here
            return FollowEnd("alone", digests)
        logs = _live_logs(tier, url)[:1]
        for _mtime, log in logs:
            before = len(digests)
            yield from _tail(log, digests, block_size, tier, url)
            if len(digests) > before:
                last_progress = time.monotonic()
        now = time.monotonic()
        if logs:
            unstarted_since = None
        elif unstarted_since is None:
            unstarted_since = now
        elif on_stuck is not None and now - unstarted_since >= UNSTARTED_WAIT:
            on_stuck()
            on_stuck = None
        if (tier.stall_timeout is not None and now - last_progress >= tier.stall_timeout) or (
            now - started >= tier.lock_timeout
        ):
            logger.warning("another process's download of %s into the cache makes no progress; fetching it uncached",
                           tier.path_for(url))
            return FollowEnd("alone", digests)
        time.sleep(poll)


def _tail(log: str, digests: List[int], block_size: int, tier, url: str):
    """Yield the blocks of the temp file beside `log` that are not handed out yet, as the log
    publishes them; return when the write ends (the temp file is gone, or the claim is free), stalls
    or fails a check."""
    temp = log[: -len(".sums.tmp")] + ".tmp"
    try:
        log_fd = os.open(log, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return
    data_fd = -1
    try:
        try:
            data_fd = os.open(temp, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            magic, size = _HEADER.unpack(os.pread(log_fd, _HEADER.size, 0))
        except (OSError, struct.error):
            return
        if magic != _MAGIC or size != block_size:
            return
        poll = min(tier.poll_interval, 0.01)
        seen = 0  # entries of the log checked against `digests` or appended to it
        last = time.monotonic()
        while True:
            raw = os.pread(log_fd, 1 << 16, _HEADER.size + seen * _DIGEST.size)
            published = [d for (d,) in _DIGEST.iter_unpack(raw[: len(raw) - len(raw) % _DIGEST.size])]
            for digest in published:
                index = seen
                seen += 1
                if index < len(digests):
                    if digests[index] != digest:
                        raise FetchError("another process's write of the shard into the cache differs from the "
                                         "bytes already delivered (did it change at the origin?)", url=url)
                    continue
                block = os.pread(data_fd, block_size, index * block_size)
                if len(block) != block_size or block_digest(block) != digest:
                    logger.warning("cache temp file %s does not match its published digests; reading on without it",
                                   temp)
                    return
                digests.append(digest)
                tier.counters.add(bytes_served=block_size)
                yield block
            if published:
                last = time.monotonic()
                continue
            if not os.path.exists(temp) or tier.claim_free(url):
                return  # committed, abandoned or killed: the caller looks which
            if time.monotonic() - last >= min(_RECHECK, tier.stall_timeout or _RECHECK):
                return  # the caller checks its deadlines (and for a newer write) and comes back
            time.sleep(poll)
    finally:
        os.close(log_fd)
        if data_fd >= 0:
            os.close(data_fd)
