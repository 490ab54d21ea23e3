"""The tiered shard cache: counters through the tiers, stream-through, discarding partial writes,
lock waits, option mapping, and several processes sharing one cache directory (one of them killed
mid-download)."""

from __future__ import annotations

import fcntl
import functools
import gc
import glob
import hashlib
import json
import multiprocessing
import os
import pickle
import random
import re
import signal
import threading
import time

import pytest
from cachehooks import before_commits
from looptools import wait_for

from shardstream._cache.naming import _file_lock, cache_file_name
from shardstream._cache.memory import MemoryTier
from shardstream._cache.disk import DiskTier
from shardstream._cache.share import preallocate
from shardstream._base.errors import NetworkError, ShardNotFound, UsageError
from shardstream._cache.shardcache import ShardCache, cache_from_options

pytestmark = pytest.mark.timeout(40)

CHUNK = 4096


def shard_url(i: int) -> str:
    # Every shard has the same basename: names must come from the whole URL.
    return f"http://host{i % 2}/set{i}/shard-000.tar"


def shard_bytes(url: str) -> bytes:
    i = int(re.search(r"/set(\d+)/", url).group(1))
    return random.Random(url).randbytes(40_000 + 3_000 * i)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Origin:
    """An in-memory origin that counts fetches and records how far each one got."""

    def __init__(self, fail_after=None):
        self.fetches = []
        self.produced = 0
        self.closed = 0
        self.fail_after = fail_after

    def __call__(self, url):
        self.fetches.append(url)
        return self._chunks(url)

    def _chunks(self, url):
        data = shard_bytes(url)
        try:
            for n, i in enumerate(range(0, len(data), CHUNK)):
                if self.fail_after is not None and n == self.fail_after:
                    raise NetworkError("connection reset", url=url, offset=i)
                self.produced += 1
                yield data[i : i + CHUNK]
        finally:
            self.closed += 1


def temps(cache_dir):
    return glob.glob(os.path.join(glob.escape(str(cache_dir)), ".*.tmp"))


def size(path):
    """The size of a file that may be gone (a temp file committed or removed meanwhile) or 0."""
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return 0


def test_hits_and_misses_through_the_tiers(tmp_path):
    url, data = shard_url(1), shard_bytes(shard_url(1))
    origin = Origin()
    cache = ShardCache([MemoryTier(1 << 20), DiskTier(str(tmp_path), 1 << 20)])
    assert b"".join(cache.stream(url, origin)) == data  # miss everywhere: origin, written through
    assert b"".join(cache.stream(url, origin)) == data  # memory hit
    stats = cache.stats()
    assert (stats["memory"]["hits"], stats["memory"]["misses"], stats["memory"]["bytes_served"]) == (1, 1, len(data))
    assert (stats["disk"]["hits"], stats["disk"]["misses"], stats["disk"]["bytes_written"]) == (0, 1, len(data))
    assert stats["origin"] == {"fetches": 1, "bytes_served": len(data), "errors": 0}

    fresh = ShardCache([MemoryTier(1 << 20), DiskTier(str(tmp_path), 1 << 20)])  # another process, say
    assert b"".join(fresh.stream(url, origin)) == data  # disk hit, fills memory
    assert b"".join(fresh.stream(url, origin)) == data  # memory hit
    stats = fresh.stats()
    assert (stats["memory"]["hits"], stats["memory"]["misses"]) == (1, 1)
    assert (stats["disk"]["hits"], stats["disk"]["misses"], stats["disk"]["bytes_served"]) == (1, 0, len(data))
    assert stats["origin"]["fetches"] == 0 and origin.fetches == [url]
    assert fresh.local_path(url) == fresh.tiers[1].path_for(url)
    assert fresh.local_path(shard_url(2)) is None
    clone = pickle.loads(pickle.dumps(fresh))  # configuration travels, counters restart
    assert clone.stats()["disk"]["hits"] == 0 and b"".join(clone.stream(url, origin)) == data


def test_no_tiers_is_a_pass_through():
    origin = Origin()
    cache = ShardCache([])
    assert b"".join(cache.stream(shard_url(0), origin)) == shard_bytes(shard_url(0))
    assert cache.stats() == {"origin": {"fetches": 1, "bytes_served": len(shard_bytes(shard_url(0))), "errors": 0}}


def test_stream_through_hands_out_bytes_before_the_origin_finishes(tmp_path):
    url, data = shard_url(0), shard_bytes(shard_url(0))
    first_received = threading.Event()
    waited = []

    def origin(u):
        yield data[:CHUNK]
        # A download-then-read cache would never deliver this chunk before we go on: we would
        # wait out the timeout and record False.
        waited.append(first_received.wait(5))
        yield data[CHUNK:]

    cache = ShardCache([MemoryTier(1 << 20), DiskTier(str(tmp_path), None)])
    received = []

    def consume():
        for chunk in cache.stream(url, origin):
            received.append(chunk)
            first_received.set()

    thread = threading.Thread(target=consume)
    thread.start()
    thread.join(10)
    assert waited == [True] and b"".join(received) == data
    assert open(cache.tiers[1].path_for(url), "rb").read() == data


class SizedStream:
    """An origin's stream that says the object's size, as an HTTP or S3 stream does once the
    response headers are in (`said` may be wrong)."""

    def __init__(self, data: bytes, said: int) -> None:
        self.data, self.size = data, said

    def __iter__(self):
        for i in range(0, len(self.data), 64 << 10):
            yield self.data[i : i + (64 << 10)]


def allocated(path) -> int:
    return os.stat(path).st_blocks * 512


@pytest.mark.parametrize("said", ["exact", "more", "beyond the disk"])
def test_a_disk_writer_preallocates_the_size_its_origin_says(tmp_path, said):
    """The origin's size is preallocated past the temp file's end (its length, which followers
    read, stays the bytes written); a shard shorter than said gives the rest back; a size that
    would not leave the disk room is not preallocated at all."""
    probe = os.open(tmp_path / "probe", os.O_WRONLY | os.O_CREAT)
    try:
        if not preallocate(probe, 0, 1 << 20):
            pytest.skip("this file system (or platform) does not preallocate")
        free = os.fstatvfs(probe).f_bavail * os.fstatvfs(probe).f_frsize
    finally:
        os.close(probe)
    url, data = shard_url(0), random.Random(5).randbytes(6 << 20)
    size = {"exact": len(data), "more": len(data) + (8 << 20), "beyond the disk": len(data) + free}[said]
    tier = DiskTier(str(tmp_path / "cache"), None)
    stream = ShardCache([tier]).stream(url, lambda u: SizedStream(data, size))
    received = [next(stream) for _ in range(40)]  # 2.5 MiB: the writer has had a batch or two
    [temp] = [path for path in temps(tmp_path / "cache") if not path.endswith(".sums.tmp")]
    if said == "beyond the disk":
        assert wait_for(lambda: os.path.getsize(temp) >= (1 << 20))
        assert allocated(temp) < (8 << 20)
    else:
        assert wait_for(lambda: allocated(temp) >= size, timeout=10)
    assert os.path.getsize(temp) < len(data)
    assert b"".join(received + list(stream)) == data
    path = tier.path_for(url)
    assert open(path, "rb").read() == data
    assert allocated(path) < len(data) + (1 << 20)  # nothing past the end kept


def test_without_fallocate_a_disk_writer_writes_as_before(tmp_path, monkeypatch):
    """A platform or file system without fallocate: nothing is preallocated, the shard is cached."""
    from shardstream._cache import share

    monkeypatch.setattr(share, "_fallocate", False)
    url, data = shard_url(0), random.Random(6).randbytes(3 << 20)
    tier = DiskTier(str(tmp_path / "cache"), None)
    assert b"".join(ShardCache([tier]).stream(url, lambda u: SizedStream(data, len(data) + (8 << 20)))) == data
    assert open(tier.path_for(url), "rb").read() == data
    assert allocated(tier.path_for(url)) < len(data) + (1 << 20)


def test_nothing_is_committed_while_streaming(tmp_path):
    url, data = shard_url(0), shard_bytes(shard_url(0))
    origin = Origin()
    tier = DiskTier(str(tmp_path), None)
    stream = ShardCache([tier]).stream(url, origin)
    assert next(stream) == data[:CHUNK] and origin.produced == 1
    written = sorted(temps(tmp_path))  # the temp file and its progress log (what other processes follow)
    assert not os.path.exists(tier.path_for(url)) and len(written) == 2 and written[0].endswith(".sums.tmp")
    assert next(stream) + b"".join(stream) == data[CHUNK:]
    assert os.path.exists(tier.path_for(url)) and temps(tmp_path) == []


def test_early_close_discards_the_temp_file(tmp_path):
    url, data = shard_url(2), shard_bytes(shard_url(2))
    origin = Origin()
    memory, disk = MemoryTier(1 << 20), DiskTier(str(tmp_path), None)
    cache = ShardCache([memory, disk])
    stream = cache.stream(url, origin)
    next(stream)
    next(stream)
    stream.close()
    assert origin.closed == 1  # the origin was stopped too
    assert temps(tmp_path) == [] and not os.path.exists(disk.path_for(url)) and url not in memory
    assert cache.stats()["disk"]["discarded"] == 1
    assert b"".join(cache.stream(url, origin)) == data and len(origin.fetches) == 2  # refetched


def test_origin_failure_discards_and_propagates(tmp_path):
    url = shard_url(3)
    origin = Origin(fail_after=3)
    disk = DiskTier(str(tmp_path), None)
    cache = ShardCache([MemoryTier(1 << 20), disk])
    got = []
    with pytest.raises(NetworkError) as info:
        for chunk in cache.stream(url, origin):
            got.append(chunk)
    assert len(got) == 3 and info.value.offset == 3 * CHUNK
    assert temps(tmp_path) == [] and not os.path.exists(disk.path_for(url))
    assert cache.stats()["origin"]["errors"] == 1 and cache.stats()["disk"]["discarded"] == 1

    def missing(u):
        raise ShardNotFound("no such shard", url=u)

    with pytest.raises(ShardNotFound):
        list(cache.stream(url, missing))
    assert temps(tmp_path) == []
    assert b"".join(cache.stream(url, Origin())) == shard_bytes(url)  # the lock was released


def test_a_full_cache_disk_never_fails_the_read(tmp_path):
    url, data = shard_url(2), shard_bytes(shard_url(2))
    disk = DiskTier(str(tmp_path), None)
    make_writer = disk.writer

    full = os.open("/dev/full", os.O_WRONLY)  # every write fails with ENOSPC

    def full_disk_writer(u, size_hint=None, **kw):
        writer = make_writer(u, size_hint, **kw)
        writer.thread.fd = full
        return writer

    disk.writer = full_disk_writer
    try:
        assert b"".join(ShardCache([disk]).stream(url, Origin())) == data
    finally:
        os.close(full)
    assert disk.counters.snapshot()["errors"] == 1 and disk.counters.snapshot()["discarded"] == 1
    assert temps(tmp_path) == [] and not os.path.exists(disk.path_for(url))


def test_a_disk_too_full_for_the_progress_log_leaves_no_file_behind(tmp_path, monkeypatch):
    """The temp file and its progress log are made, the log's header cannot be written: neither
    stays (the log used to, until another process's cleanup)."""
    import errno

    import shardstream._cache.share as share

    disk = DiskTier(str(tmp_path), None)

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(share.os, "write", full)  # (the os module: only the writer runs meanwhile)
    writer = disk.writer(shard_url(2))
    monkeypatch.undo()
    assert writer is None and temps(tmp_path) == []
    url, data = shard_url(2), shard_bytes(shard_url(2))
    assert b"".join(ShardCache([disk]).stream(url, Origin())) == data and temps(tmp_path) == []


def test_same_url_twice_in_one_process_does_not_wait_on_itself(tmp_path):
    url, data = shard_url(1), shard_bytes(shard_url(1))
    origin = Origin()
    disk = DiskTier(str(tmp_path), None, lock_timeout=5)
    cache = ShardCache([disk])
    first, second = cache.stream(url, origin), cache.stream(url, origin)
    a, b = [next(first)], [next(second)]  # interleaved in one thread: waiting would deadlock
    a += list(first)
    b += list(second)
    assert b"".join(a) == data == b"".join(b)
    assert disk.counters.snapshot()["bypassed"] == 1 and len(origin.fetches) == 2
    assert open(disk.path_for(url), "rb").read() == data and temps(tmp_path) == []


@pytest.mark.parametrize("option", ["lock_timeout", "stall_timeout"])
def test_lock_wait_gives_up_and_streams_uncached(tmp_path, option):
    url, data = shard_url(0), shard_bytes(shard_url(0))
    kwargs = {"lock_timeout": 0.3, "stall_timeout": None} if option == "lock_timeout" else {
        "lock_timeout": 30, "stall_timeout": 0.3}
    disk = DiskTier(str(tmp_path), None, **kwargs)
    holder = _file_lock(os.path.join(str(tmp_path), ".locks", cache_file_name(url)))
    holder.acquire()  # a stuck holder whose temp file never grows
    try:
        start = time.monotonic()
        assert b"".join(ShardCache([disk]).stream(url, Origin())) == data
        assert time.monotonic() - start < 3
    finally:
        holder.release()
    assert disk.counters.snapshot()["bypassed"] == 1 and not os.path.exists(disk.path_for(url))


def test_cache_from_options_maps_webdataset_arguments(tmp_path):
    d = str(tmp_path)
    assert cache_from_options(environ={}) is None
    assert cache_from_options(d, 0, environ={}) is None  # webdataset: size 0 = no cache
    (disk,) = cache_from_options(d, -1, environ={}).tiers
    assert isinstance(disk, DiskTier) and disk.max_bytes is None and disk.cache_dir == d
    assert cache_from_options(d, 12345, environ={}).tiers[0].max_bytes == 12345
    env = {"WDS_CACHE": d, "WDS_CACHE_SIZE": "1e6"}  # the environment wins over arguments
    (disk,) = cache_from_options("/nonexistent", 5, environ=env).tiers
    assert (disk.cache_dir, disk.max_bytes) == (d, 1_000_000)
    assert cache_from_options(d, -1, environ={"WDS_CACHE_SIZE": "0"}) is None
    memory, disk = cache_from_options(d, -1, memory_bytes=1000, environ={}).tiers
    assert isinstance(memory, MemoryTier) and memory.max_bytes == 1000
    (memory,) = cache_from_options(None, -1, memory_bytes=1000, environ={}).tiers
    with pytest.raises(UsageError, match="does not exist"):
        cache_from_options(str(tmp_path / "missing"), environ={})
    with pytest.raises(UsageError):
        cache_from_options(d, environ={"WDS_CACHE_SIZE": "lots"})
    assert cache_from_options(d, -1, environ={}, lock_timeout=7).tiers[0].lock_timeout == 7


# --- several processes, one cache directory ------------------------------------------------------


def _log(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())  # one small O_APPEND write: lines never interleave
    finally:
        os.close(fd)


def _slow_origin(url: str, log_path: str, delay: float):
    _log(log_path, f"start {os.getpid()} {url}")
    data = shard_bytes(url)
    for i in range(0, len(data), CHUNK):
        time.sleep(delay)
        yield data[i : i + CHUNK]
    _log(log_path, f"end {os.getpid()} {url}")


def _worker(cache_dir, bound, urls, log_path, out_path, delay):
    cache = ShardCache([DiskTier(cache_dir, bound, lock_timeout=20, stall_timeout=None, chunk_size=CHUNK)])
    origin = functools.partial(_slow_origin, log_path=log_path, delay=delay)
    digests = {}
    for url in urls:
        digest = hashlib.sha256()
        for chunk in cache.stream(url, origin):
            digest.update(chunk)
        digests[url] = digest.hexdigest()
    with open(out_path + ".part", "w") as f:
        json.dump({"digests": digests, "stats": cache.stats()}, f)
    os.replace(out_path + ".part", out_path)


class DirectoryMonitor(threading.Thread):
    """Watches a cache directory: every committed file must be a whole, correct shard, and the
    committed bytes (measured under the tier's eviction lock, so the view is consistent) must
    stay within the bound."""

    def __init__(self, cache_dir, urls, bound):
        super().__init__(daemon=True)
        self.cache_dir, self.bound = cache_dir, bound
        self.expected = {cache_file_name(u): sha(shard_bytes(u)) for u in urls}
        self.stop = threading.Event()
        self.violations, self.max_committed, self.checks = [], 0, 0

    def run(self):
        lock_path = os.path.join(self.cache_dir, ".locks", ".evict")
        while not self.stop.is_set():
            # Raw flock, not filelock: this thread runs while the test forks workers.
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                names = [n for n in os.listdir(self.cache_dir) if not n.startswith(".")]
                total = sum(os.path.getsize(os.path.join(self.cache_dir, n)) for n in names)
            finally:
                os.close(fd)
            self.max_committed = max(self.max_committed, total)
            for name in names:
                try:
                    with open(os.path.join(self.cache_dir, name), "rb") as f:
                        data = f.read()
                except FileNotFoundError:  # evicted meanwhile
                    continue
                if self.expected.get(name) != sha(data):
                    self.violations.append((name, len(data)))
                self.checks += 1
            time.sleep(0.005)


def _run_workers(tmp_path, bound, orders, delay, victim_delay=None):
    cache_dir, log_path = str(tmp_path / "cache"), str(tmp_path / "origin.log")
    os.makedirs(cache_dir)
    DiskTier(cache_dir, bound)  # creates the layout the monitor locks
    urls = sorted({u for order in orders for u in order}, key=lambda u: int(re.search(r"set(\d+)", u).group(1)))
    ctx = multiprocessing.get_context("fork")
    monitor = DirectoryMonitor(cache_dir, urls, bound)
    victim = None
    if victim_delay is not None:  # starts first and is killed in the middle of downloading urls[0]
        victim = ctx.Process(target=_worker, args=(cache_dir, bound, [urls[0]], log_path, str(tmp_path / "v"), victim_delay))
        victim.start()
        assert wait_for(lambda: any(size(p) >= CHUNK for p in temps(cache_dir)), 10), "the victim never started writing"
    workers = [
        ctx.Process(target=_worker, args=(cache_dir, bound, order, log_path, str(tmp_path / f"out{n}"), delay))
        for n, order in enumerate(orders)
    ]
    for w in workers:
        w.start()
    monitor.start()
    victim_temps = []
    if victim is not None:
        time.sleep(0.3)  # the others are now waiting for the victim's lock on urls[0]
        assert victim.is_alive()
        victim_temps = [p for p in temps(cache_dir) if f".{victim.pid}." in p]
        victim.kill()
        victim.join(5)
        assert victim.exitcode == -signal.SIGKILL
    for w in workers:
        w.join(25)
    monitor.stop.set()
    monitor.join(5)
    assert [w.exitcode for w in workers] == [0] * len(workers)
    results = [json.load(open(tmp_path / f"out{n}")) for n in range(len(workers))]
    starts = {}
    for line in open(log_path).read().splitlines():
        kind, pid, url = line.split()
        if kind == "start":
            starts.setdefault(url, []).append(int(pid))
    return cache_dir, urls, results, starts, monitor, victim, victim_temps


def test_processes_share_one_download_and_survive_a_killed_downloader(tmp_path):
    urls = [shard_url(i) for i in range(6)]
    bound = sum(len(shard_bytes(u)) for u in urls)  # everything fits: each URL downloads once
    orders = [urls, [urls[0]] + urls[:0:-1], urls[3:] + urls[:3]]
    cache_dir, urls, results, starts, monitor, victim, victim_temps = _run_workers(
        tmp_path, bound, orders, delay=0.01, victim_delay=0.3
    )
    expected = {u: sha(shard_bytes(u)) for u in urls}
    for result in results:
        assert result["digests"] == expected  # every byte equals the origin's: nothing partial was read
    # One download per URL; urls[0] twice: the victim's broken one and exactly one redo.
    assert {u: len(p) for u, p in starts.items()} == {u: 2 if u == urls[0] else 1 for u in urls}
    assert victim.pid in starts[urls[0]]
    assert sum(r["stats"]["disk"]["hits"] for r in results) == 3 * len(urls) - 6
    assert monitor.checks > 0 and monitor.violations == []
    assert monitor.max_committed <= bound
    # The victim left a temp file behind; the survivors' commits cleaned it up.
    assert victim_temps and not any(os.path.exists(p) for p in victim_temps)
    assert temps(cache_dir) == []
    assert sorted(n for n in os.listdir(cache_dir) if not n.startswith(".")) == sorted(
        cache_file_name(u) for u in urls
    )


def test_processes_keep_a_tight_byte_bound(tmp_path):
    urls = [shard_url(i) for i in range(6)]
    sizes = sorted(len(shard_bytes(u)) for u in urls)
    bound = sum(sizes[-3:])  # about half the shards fit: evictions race with reads
    orders = [urls[k:] + urls[:k] for k in (0, 2, 4, 1)]
    cache_dir, urls, results, starts, monitor, _, _ = _run_workers(tmp_path, bound, orders, delay=0.002)
    expected = {u: sha(shard_bytes(u)) for u in urls}
    assert all(r["digests"] == expected for r in results)
    assert monitor.checks > 0 and monitor.violations == []
    assert monitor.max_committed <= bound
    assert sum(r["stats"]["disk"]["evictions"] for r in results) > 0
    assert DiskTier(cache_dir, bound).committed_bytes() <= bound and temps(cache_dir) == []


def test_a_write_that_failed_before_the_commit_lets_the_claim_go(tmp_path):
    """The writer thread stopped on a failed write after the last chunk was handed over, before
    the stream asked for its commit (`commit_soon`): the commit is settled at once, the claim
    released, nothing waits."""
    url, data = shard_url(2), shard_bytes(shard_url(2))
    disk = DiskTier(str(tmp_path), None, chunk_size=4096)  # small blocks: the thread writes each chunk
    make_writer, made = disk.writer, []
    full = os.open("/dev/full", os.O_WRONLY)

    def recording_writer(u, size_hint=None, **kw):
        made.append(make_writer(u, size_hint, **kw))
        return made[-1]

    def origin(u):
        pieces = [data[i : i + 4096] for i in range(0, len(data), 4096)]
        for n, piece in enumerate(pieces):
            if n == len(pieces) - 1:
                made[0].thread.fd = full  # only the last write fails
            yield piece

    disk.writer = recording_writer
    cache = ShardCache([disk])
    try:
        stream = cache.stream(url, origin, settled=False)
        got = []
        for piece in stream:
            got.append(piece)
            if len(got) == -(-len(data) // 4096):  # the last chunk is out: let its write fail
                assert wait_for(lambda: not made[0].thread.alive, 10)
        start = time.monotonic()
        cache.settle()
        assert time.monotonic() - start < 5
    finally:
        os.close(full)
    assert b"".join(got) == data and not disk.writing_here(url)
    assert disk.counters.snapshot()["errors"] == 1 and temps(tmp_path) == []


@pytest.mark.parametrize("settled", [True, False])
def test_commits_close_their_files(tmp_path, settled):
    """A commit on the writer thread closes the temp file and progress log like one on the
    reader's: no descriptor is left open per shard."""
    cache = ShardCache([DiskTier(str(tmp_path), None)])
    before = sorted(os.listdir("/proc/self/fd"))
    for i in range(5):
        url = shard_url(i)
        assert b"".join(cache.stream(url, Origin(), settled=settled)) == shard_bytes(url)
    cache.settle()
    assert sorted(os.listdir("/proc/self/fd")) == before and temps(tmp_path) == []


@pytest.mark.parametrize("settled", [True, False])
def test_commits_leave_nothing_for_the_collector(tmp_path, settled):
    """A committed shard's writer, its thread and its digest are freed by reference counting: no
    reference cycle waits for the garbage collector (one per shard, with its locks and queues, did)."""
    cache = ShardCache([DiskTier(str(tmp_path), None)])
    assert b"".join(cache.stream(shard_url(0), Origin())) == shard_bytes(shard_url(0))  # (imports, caches)
    cache.settle()
    gc.collect()
    gc.disable()
    try:
        for i in range(1, 4):
            url = shard_url(i)
            assert b"".join(cache.stream(url, Origin(), settled=settled)) == shard_bytes(url)
        cache.settle()
        wait_for(lambda: not [t for t in threading.enumerate() if t.name == "shardstream-cache-writer"], timeout=5)
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        kinds = sorted({type(obj).__name__ for obj in gc.garbage})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert kinds == []


def test_a_lookup_waits_for_a_commit_in_progress(tmp_path, monkeypatch):
    """A second stream of a shard whose commit is still on the writer thread reads the committed
    file: one origin fetch, one hit."""
    url, data = shard_url(1), shard_bytes(shard_url(1))
    entered = threading.Event()

    def slow(tier, url):
        entered.set()
        time.sleep(0.5)

    before_commits(monkeypatch, slow)
    origin, disk = Origin(), DiskTier(str(tmp_path), None)
    cache = ShardCache([disk])
    assert b"".join(cache.stream(url, origin, settled=False)) == data
    assert entered.wait(5) and not os.path.exists(disk.path_for(url))  # still committing
    assert b"".join(cache.stream(url, origin)) == data
    assert len(origin.fetches) == 1 and disk.counters.snapshot()["hits"] == 1


def test_a_hung_commit_is_given_up_once(tmp_path, monkeypatch):
    """A commit that does not end (a hung cache disk) is given up after the wait's timeout: its
    claim is released and later lookups do not wait for it."""
    from shardstream._cache import share

    url, data = shard_url(1), shard_bytes(shard_url(1))
    release = threading.Event()
    before_commits(monkeypatch, lambda tier, url: release.wait(30))
    # 60 s in use; it also bounds the writer's own waits (put, finish, cancel), which this 43 KB
    # shard, committed through finish_soon, never reaches
    monkeypatch.setattr(share, "WRITE_STALL", 0.5)
    disk = DiskTier(str(tmp_path), None)
    cache = ShardCache([disk])
    try:
        assert b"".join(cache.stream(url, Origin(), settled=False)) == data
        assert disk.writing_here(url)  # the commit holds the claim
        start = time.monotonic()
        assert disk.lookup(url) is None  # waited 0.5 s, gave the commit up
        assert 0.4 < time.monotonic() - start < 5
        assert not disk.writing_here(url) and disk.claim_free(url)
        start = time.monotonic()
        assert disk.lookup(url) is None and disk.settle(url) is True
        assert time.monotonic() - start < 0.3  # given up once: nobody waits for it again
    finally:
        release.set()
    wait_for(lambda: not temps(tmp_path), 10)
    # The disk came back inside the commit: the file is whole and checked, so it is committed.
    hit = disk.lookup(url)
    assert temps(tmp_path) == [] and hit is not None and b"".join(hit) == data
    hit.close()
