"""The node-shared, byte-bounded on-disk tier (the in-memory tier is in `memory.py`).

Each tier is a small named strategy with thread-safe counters (the fsspec `caching.py` habit).
A tier answers `lookup(url)` with a source of byte chunks or None, and hands out `writer(url)`s
that are committed only when a shard arrived whole. Node-shared tiers (`shared = True`) also
hand out claims (`try_claim(url)`, `claim(url)`): a per-URL lock across processes, so one process
downloads a shard while the others follow its write (`_cache.share`). `ShardCache` (in `_cache.shardcache`) searches tiers in order and streams
misses through them; the tiers never decide what to fetch.

Disk layout of a `DiskTier` (one directory, so every rename is atomic):

    <digest>-<basename>                       committed shard bytes (exactly the origin's bytes)
    .<digest>-<basename>.meta                 sidecar: size, URL digest, a digest per block (`_cache.check`)
    .<name>.<host>.<pid>.<random>.tmp         a write in progress (or left by a dead process)
    .<name>.<host>.<pid>.<random>.sums.tmp    its progress log: the digests of the blocks written so far,
                                              which other processes follow (`_cache.share`)
    .locks/<digest>-<basename>, .locks/.evict flock files (never deleted: see `claim`)
    .locks/usage                              the committed bytes, so a commit need not list the directory
                                              (`_cache.usage`)

Why this module is over 400 lines: DiskTier is one class whose parts (lookup, writers, claims,
eviction, cleanup of dead writers' files) share one directory's invariants and one lock; names
and locks are in `naming.py`, temp names and writer liveness in `_base/processes.py`, the writer
thread and followers in `share.py`.
"""

from __future__ import annotations

import collections
import contextlib
import glob
import logging
import os
import secrets
import stat
import threading
import time
from typing import Deque, Dict, Iterator, List, Optional, Tuple

from filelock import FileLock, Timeout

from .._base.errors import UsageError
from .check import BlockDigest, ShardRecord, VerifiedFile, read_record, write_record
from .share import DiskWriter, PendingCommits, open_progress_log
from .usage import Usage, read_usage, write_usage
from .memory import CHUNK_SIZE, TierCounters
from .._base.processes import HOST, TEMP, left_by_dead_writer, temp_name
from .naming import _file_lock, _unlink, _url_digest, cache_file_name

__all__ = ["DiskTier"]

logger = logging.getLogger("shardstream._cache.tiers")


class _Claim:
    """The right to fetch one URL into a disk tier; `release` lets waiting processes in."""

    def __init__(self, tier: "DiskTier", url: str, lock: FileLock) -> None:
        self.tier, self.url = tier, url
        self.lock: Optional[FileLock] = lock

    def release(self) -> None:
        if self.lock is not None:
            lock, self.lock = self.lock, None
            lock.release()
            self.tier._claim_done(self.url)


class DiskTier:
    """Committed whole shards in a directory shared by all processes on a node.

    Args:
        cache_dir: the directory (created if missing); the cache owns every file in it.
        max_bytes: bound on committed bytes, kept by LRU eviction (by mtime; hits touch); None
            for no bound. A shard larger than the bound is streamed but never kept.
        lock_timeout: longest wait for another process's download of the same URL (following its
            write, or waiting for its claim after a corrupt file), in seconds; after it the shard
            is streamed from the origin without caching.
        stall_timeout: give up sooner when the other process's write has made no progress for
            this long (a stuck holder, e.g. a training loop waiting on us); None disables.
        chunk_size: the block size of the digests recorded for new files (and published while
            they are written), and so the step in which hits are checked and parsed.
    """

    shared = True

    def __init__(
        self,
        cache_dir: str,
        max_bytes: Optional[int] = None,
        *,
        name: str = "disk",
        lock_timeout: float = 600.0,
        stall_timeout: Optional[float] = 120.0,
        chunk_size: int = CHUNK_SIZE,
        poll_interval: float = 0.05,
    ) -> None:
        if max_bytes is not None and max_bytes <= 0:
            raise ValueError(f"max_bytes must be > 0 or None, got {max_bytes}")
        self.cache_dir = os.path.abspath(os.path.expanduser(os.fspath(cache_dir)))
        self.max_bytes = None if max_bytes is None else int(max_bytes)
        self.name = name
        self.lock_timeout = lock_timeout
        self.stall_timeout = stall_timeout
        self.chunk_size = chunk_size
        self.poll_interval = poll_interval
        self.counters = TierCounters(name)
        self._lock_dir = os.path.join(self.cache_dir, ".locks")
        self._usage_path = os.path.join(self._lock_dir, "usage")  # (`_cache.usage`)
        self._oldest: Deque[Tuple[int, str, int]] = collections.deque()  # files by age at the last listing
        try:
            os.makedirs(self._lock_dir, exist_ok=True)
        except OSError as exn:
            raise UsageError(f"cache_dir {self.cache_dir!r} cannot be used: {exn.strerror} ({self._lock_dir})") from exn
        self._lock_failed = False  # (a lock file that cannot be made is said once)
        self._pid = -1
        self._local()
        self.cleanup()

    def _local(self) -> threading.Lock:
        # After a fork the parent's in-flight claims and readers are not ours, and its locks may
        # have been copied while held: start afresh in the child.
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._mutex = threading.Lock()
            self._commit_mutex = threading.Lock()
            self._writing: set = set()
            self._pending = PendingCommits()
            self._readers: Dict[str, int] = {}
            self._unlockable: set = set()  # URLs whose lock file could not be made at the last try
        return self._mutex

    @contextlib.contextmanager
    def _evict_lock(self) -> Iterator[None]:
        """The node-wide evict lock, with this process's commit mutex: every commit, listing,
        eviction and ledger update holds it (raises filelock's Timeout after `lock_timeout`)."""
        self._local()
        with self._commit_mutex, _file_lock(os.path.join(self._lock_dir, ".evict")).acquire(
            timeout=self.lock_timeout, poll_interval=self.poll_interval
        ):
            yield

    @property
    def pending(self) -> PendingCommits:
        """This process's commits in progress on writer threads (`DiskWriter.commit_soon`)."""
        self._local()
        return self._pending

    def path_for(self, url: str) -> str:
        """Where `url` is (or would be) committed."""
        return os.path.join(self.cache_dir, cache_file_name(url))

    @staticmethod
    def _meta_path(path: str) -> str:
        head, base = os.path.split(path)
        return os.path.join(head, f".{base}.meta")

    def lookup(self, url: str, *, repair: bool = False) -> Optional[VerifiedFile]:
        """An open committed copy of `url` (marked recently used) that checks each block as it
        is read, else None.

        A file without a record of its size and block CRCs (e.g. written by an earlier version)
        or whose size differs from the record is never served; with `repair` (the caller holds
        `claim(url)`) it is also deleted.
        """
        self.pending.wait(url)  # a commit of ours in progress: its file, not the origin (or given up)
        path = self.path_for(url)
        try:
            f = open(path, "rb")
        except FileNotFoundError:
            return None
        except OSError as exn:
            logger.warning("cannot open cached shard %s: %s", path, exn)
            self.counters.add(errors=1)
            return None
        try:
            st = os.fstat(f.fileno())
            record = read_record(self._meta_path(path))
        except BaseException:
            f.close()
            raise
        if record is None or not record.verifiable(st.st_size, _url_digest(url)):
            f.close()
            if repair:
                self.counters.add(invalid=1)
                if record is not None and record.crcs is None:
                    logger.info("cached shard %s has no recorded digest (an older cache): fetching it again", path)
                else:
                    logger.warning("discarding invalid cached shard %s", path)
                self._discard(path, record.size if record is not None else st.st_size)  # (what was counted)
            return None
        self._touch(path)
        with self._local():
            self._readers[path] = self._readers.get(path, 0) + 1
        return VerifiedFile(self, path, f, record, (st.st_dev, st.st_ino), url)

    def discard_corrupt(self, source: VerifiedFile) -> bool:
        """Delete the committed file that `source` found corrupt, if the path still holds that
        very file (call while holding `claim(url)`, so no commit can race with the check).

        False when another process already removed or replaced it: a replacement is never
        deleted on the strength of a failure found in its predecessor.
        """
        try:
            st = os.stat(source.path)
        except FileNotFoundError:
            return False
        if (st.st_dev, st.st_ino) != source.ident:
            return False
        self._discard(source.path, source.record.size)  # (what its commit counted)
        return True

    def _discard(self, path: str, size: int) -> None:
        """Remove a committed file found invalid, and take it off the usage ledger: left there,
        the next commit would count it and evict good files to make room for it."""
        self._remove(path)
        try:
            with self._evict_lock():
                usage = read_usage(self._usage_path)
                if usage is not None:
                    write_usage(self._usage_path, usage._replace(total=max(0, usage.total - size)))
        except (OSError, Timeout) as exn:  # (the ledger then over-counts until the next listing)
            logger.warning("cannot update the usage ledger of %s: %s", self.cache_dir, exn)

    def _reader_done(self, path: str) -> None:
        with self._local():
            n = self._readers.pop(path, 1) - 1
            if n > 0:
                self._readers[path] = n

    def claim(self, url: str) -> Optional[_Claim]:
        """Wait for the node-wide right to fetch `url` into this tier.

        None means "do not write this tier": this process is already fetching the URL (waiting
        on ourselves could deadlock a consumer that interleaves two streams), or the wait timed
        out or stalled. Lock files are never deleted: unlinking a flock file while others wait on
        it would let two processes hold "the" lock at once.
        """
        mutex = self._local()
        with mutex:
            if url in self._writing:
                self.counters.add(bypassed=1)
                return None
            self._writing.add(url)
        name = cache_file_name(url)
        lock = _file_lock(os.path.join(self._lock_dir, name))
        try:
            acquired = self._acquire(lock, name)
        except OSError as exn:  # no lock file: a full (inodes) or read-only cache disk
            self._claim_done(url)
            self._cannot_lock(url, exn)
            return None
        except BaseException:
            self._claim_done(url)
            raise
        self._unlockable.discard(url)
        if not acquired:
            self._claim_done(url)
            self.counters.add(bypassed=1)
            logger.warning("gave up waiting for another process to cache %s; streaming it uncached", name)
            return None
        return _Claim(self, url, lock)

    def settle(self, url: Optional[str] = None, timeout: Optional[float] = None) -> bool:
        """Wait for this process's commits in progress (`DiskWriter.commit_soon`) of `url`, or of
        every URL: each shard read whole is then in the directory. False when one is still going
        after `timeout` seconds (the cache's WRITE_STALL when None)."""
        return self.pending.wait(url, timeout)

    def writing_here(self, url: str) -> bool:
        """Whether this process holds `url`'s claim (a second stream of ours bypasses the tier)."""
        with self._local():
            return url in self._writing

    def try_claim(self, url: str) -> Optional[_Claim]:
        """The node-wide right to fetch `url` into this tier if it is free now, else None (another
        process holds it, or this one: see `writing_here`). Never waits."""
        with self._local():
            if url in self._writing:
                return None
            self._writing.add(url)
        lock = _file_lock(os.path.join(self._lock_dir, cache_file_name(url)))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            self._claim_done(url)
            return None
        except OSError as exn:
            self._claim_done(url)
            self._cannot_lock(url, exn)
            return None
        except BaseException:
            self._claim_done(url)
            raise
        self._unlockable.discard(url)
        return _Claim(self, url, lock)

    def claim_free(self, url: str) -> bool:
        """Whether no process holds `url`'s claim now (its writer committed, failed or died)."""
        return not self.claimed_elsewhere(url)

    def claimed_elsewhere(self, url: str) -> bool:
        """Whether another process holds `claim(url)` now, i.e. is fetching `url` into this tier
        (or re-fetching it after finding its file corrupt)."""
        with self._local():
            if url in self._writing:  # our own claim: a second stream of ours bypasses the tier
                return False
        lock = _file_lock(os.path.join(self._lock_dir, cache_file_name(url)))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            return True
        except OSError:  # no lock file can be made here: nobody writes this tier (claims fail alike)
            return False
        lock.release()
        return False

    def _cannot_lock(self, url: str, exn: OSError) -> None:
        """A claim's lock file could not be made: the shard streams uncached (said once per tier)."""
        with self._local():
            self._unlockable.add(url)
        log = logger.debug if self._lock_failed else logger.warning
        self._lock_failed = True
        log("cannot lock %s in the cache folder %s (%s); streaming shards it misses uncached",
            cache_file_name(url), self.cache_dir, exn.strerror or exn)

    def unlockable(self, url: str) -> bool:
        """Whether the last claim of `url` failed because its lock file could not be made (not
        because another process holds it): nobody can be writing it here, so there is nothing
        to follow."""
        with self._local():
            return url in self._unlockable

    def _claim_done(self, url: str) -> None:
        with self._local():
            self._writing.discard(url)

    def _acquire(self, lock: FileLock, name: str) -> bool:
        start = last_change = time.monotonic()
        progress = None
        while True:
            # Wake up now and then to check the deadline and whether the holder still makes progress.
            step = min(1.0, self.lock_timeout - (time.monotonic() - start))
            if self.stall_timeout is not None:
                step = min(step, self.stall_timeout / 4)
            try:
                lock.acquire(timeout=max(0.0, step), poll_interval=self.poll_interval)
                return True
            except Timeout:
                pass
            now = time.monotonic()
            if now - start >= self.lock_timeout:
                return False
            if self.stall_timeout is not None:
                seen = self._temp_progress(name)
                if seen != progress:
                    progress, last_change = seen, now
                elif now - last_change >= self.stall_timeout:
                    return False

    def _temp_progress(self, name: str) -> List[Tuple[str, int]]:
        pattern = os.path.join(glob.escape(self.cache_dir), glob.escape(f".{name}") + ".*.tmp")
        seen = []
        for path in glob.glob(pattern):
            try:
                seen.append((path, os.stat(path).st_size))
            except OSError:
                pass
        return sorted(seen)

    def writer(self, url: str, size_hint: Optional[int] = None) -> Optional[DiskWriter]:
        """A temp-file writer for `url` (call while holding `claim(url)`), or None. It publishes its
        progress, so that other processes can follow the write."""
        if self.max_bytes is not None and size_hint is not None and size_hint > self.max_bytes:
            return None
        name = cache_file_name(url)
        # We hold the claim: other temp files of this URL are dead writers' (followers must not
        # tail them while they wait for ours).
        for stale in glob.glob(os.path.join(glob.escape(self.cache_dir), glob.escape(f".{name}") + ".*.tmp")):
            if TEMP.match(os.path.basename(stale)):
                _unlink(stale)
        temp = os.path.join(self.cache_dir, temp_name(name))
        fd = log_fd = None
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
            log_fd = open_progress_log(temp, self.chunk_size)
        except OSError as exn:
            logger.warning("cannot create cache temp file %s: %s", temp, exn)
            self.counters.add(errors=1)
            if fd is not None:
                os.close(fd)
                _unlink(temp)
            return None
        return DiskWriter(self, url, temp, fd, log_fd)

    def _commit(self, url: str, temp: str, size: int, digest: BlockDigest) -> bool:
        path = self.path_for(url)
        meta = self._meta_path(path)
        meta_temp = f"{meta}.{HOST}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            with self._evict_lock():
                self._account(size, path)
                with open(meta_temp, "w") as f:
                    write_record(f, size, _url_digest(url), digest.block_size, digest.finish())
                # Sidecar first: a crash in between leaves an orphan sidecar, never a shard without
                # its record (a reader that pairs a new record with the file it replaces finds the
                # mismatch block by block, like any corruption).
                os.replace(meta_temp, meta)
                os.replace(temp, path)
                self._touch(path)
        except (OSError, Timeout) as exn:
            logger.warning("cannot commit cached shard %s: %s", path, exn)
            self.counters.add(errors=1, discarded=1)
            _unlink(temp)
            _unlink(meta_temp)
            return False
        self.counters.add(bytes_written=size)
        return True

    def cleanup(self) -> None:
        """Delete temp files of dead processes on this host and orphan sidecars; enforce the bound."""
        try:
            with self._evict_lock():
                self._scan()
        except (OSError, Timeout) as exn:
            logger.warning("cache cleanup of %s failed: %s", self.cache_dir, exn)

    def _account(self, size: int, path: str) -> None:
        """Count a commit of `size` bytes to `path` in the usage ledger (caller holds the evict
        lock): one read and one rename, unless the ledger asks for a listing (`_cache.usage`)."""
        usage = read_usage(self._usage_path)
        if usage is not None and not usage.stale():
            try:
                replaced = os.stat(path).st_size  # a shard committed again (after corruption, say)
            except OSError:
                replaced = 0
            total = usage.total + size - replaced
            fits = self.max_bytes is None or total <= self.max_bytes
            if not fits:
                total, fits = self._evict_oldest(total, path)
            if fits:
                try:
                    write_usage(self._usage_path, usage._replace(total=total))
                    return
                except OSError:  # (a full disk, say): the listing below evicts first, then writes it
                    pass
        self._scan(reserve=size, replacing=path)

    def _evict_oldest(self, total: int, replacing: str) -> Tuple[int, bool]:
        """Evict from the oldest files the last listing saw until `total` fits the bound, without
        listing again; the total after, and whether it fits (if not, list the directory).

        Exact LRU all the same: a file committed since that listing is newer than all of them, and
        one used since (a hit touches it) is checked by its mtime and skipped."""
        assert self.max_bytes is not None
        with self._local():
            busy = set(self._readers)
        oldest, evicted, kept = self._oldest, 0, []
        while total > self.max_bytes and oldest:
            mtime_ns, path, _ = entry = oldest.popleft()
            if path in busy or path == replacing:
                kept.append(entry)  # files in use go last (a listing evicts them if it must)
                continue
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue  # evicted by another process
            if st.st_mtime_ns != mtime_ns:
                continue  # used since the listing: newer than every file left here
            self._remove(path)
            total -= st.st_size
            evicted += 1
        oldest.extendleft(reversed(kept))
        self.counters.add(evictions=evicted)
        return total, total <= self.max_bytes

    def _scan(self, reserve: int = 0, replacing: Optional[str] = None) -> None:
        """One pass over the directory (caller holds the evict lock): clean up, evict LRU, and
        write what it counted (with `reserve` bytes about to be committed) to the usage ledger."""
        listed_at = time.time()
        for stale in glob.glob(glob.escape(self._usage_path) + ".*.tmp"):
            _unlink(stale)  # a ledger write killed midway (they all happen under the evict lock we hold)
        files: List[Tuple[int, str, int]] = []  # (mtime_ns, path, size) of committed shards
        sidecars = []
        with os.scandir(self.cache_dir) as entries:
            for entry in entries:
                if entry.name.startswith("."):
                    if TEMP.match(entry.name):
                        # Only this host's pids can be checked; a live pid's write is in progress.
                        if left_by_dead_writer(entry.name):
                            _unlink(entry.path)
                    elif entry.name.endswith(".meta"):
                        sidecars.append(entry)
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if stat.S_ISREG(st.st_mode) and entry.path != replacing:
                    files.append((st.st_mtime_ns, entry.path, st.st_size))
        names = {os.path.basename(p) for _, p, _ in files}
        names.add(os.path.basename(replacing or ""))
        for entry in sidecars:
            if entry.name[1:-5] not in names:
                _unlink(entry.path)
        total = reserve + sum(size for _, _, size in files)
        if self.max_bytes is None:
            write_usage(self._usage_path, Usage(total, listed_at))
            return
        files.sort()
        with self._local():
            busy = set(self._readers)
        evicted: set = set()
        # Files this process is reading go last (unlinking them is safe, but frees nothing yet).
        for want_busy in (False, True):
            for _, path, size in files:
                if total <= self.max_bytes:
                    break
                if (path in busy) == want_busy:
                    self._remove(path)
                    total -= size
                    evicted.add(path)
        self.counters.add(evictions=len(evicted))
        self._oldest = collections.deque(f for f in files if f[1] not in evicted)  # (`_evict_oldest`)
        write_usage(self._usage_path, Usage(total, listed_at))

    def _remove(self, path: str) -> None:
        _unlink(path)
        _unlink(self._meta_path(path))

    def __contains__(self, url: str) -> bool:
        """Whether `url` is committed here now: its file and its record exist (not checked)."""
        path = self.path_for(url)
        return os.path.exists(path) and os.path.exists(self._meta_path(path))

    def record(self, url: str) -> Optional[ShardRecord]:
        """The sidecar record of `url`'s committed file, if any (not checked against the file)."""
        return read_record(self._meta_path(self.path_for(url)))

    @staticmethod
    def _touch(path: str) -> None:
        # Explicit nanoseconds: coarse filesystem clocks would otherwise tie recent uses.
        now = time.time_ns()
        try:
            os.utime(path, ns=(now, now))
        except PermissionError:  # someone else's file: "now" needs only write access
            try:
                os.utime(path)
            except OSError:
                pass
        except OSError:
            pass

    def committed_bytes(self) -> int:
        """Total size of the committed shards in the directory."""
        total = 0
        with os.scandir(self.cache_dir) as entries:
            for entry in entries:
                if not entry.name.startswith("."):
                    try:
                        if entry.is_file(follow_symlinks=False):
                            total += entry.stat(follow_symlinks=False).st_size
                    except FileNotFoundError:
                        pass
        return total

    def __getstate__(self):  # configuration only: locks, readers and counters are per process
        return {
            "cache_dir": self.cache_dir,
            "max_bytes": self.max_bytes,
            "name": self.name,
            "lock_timeout": self.lock_timeout,
            "stall_timeout": self.stall_timeout,
            "chunk_size": self.chunk_size,
            "poll_interval": self.poll_interval,
        }

    def __setstate__(self, state) -> None:
        state = dict(state)
        DiskTier.__init__(self, state.pop("cache_dir"), state.pop("max_bytes"), **state)
