"""Cache tiers: the memory LRU, the disk tier's naming, atomic commits, LRU bound, temp cleanup
and validation. A shared conformance class runs against every tier; only the fixture differs."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import threading
import time

import pytest
from cachehooks import put

from shardstream._base.processes import HOST as _HOST
from shardstream._cache.naming import cache_file_name
from shardstream._cache.memory import MemoryTier
from shardstream._cache.disk import DiskTier
from shardstream._cache.shardcache import ShardCache

pytestmark = pytest.mark.timeout(30)


def read(tier, url):
    source = tier.lookup(url)
    if source is None:
        return None
    try:
        return b"".join(source)
    finally:
        source.close()


def temp_files(cache_dir):
    return sorted(n for n in os.listdir(cache_dir) if n.endswith(".tmp"))


def committed(cache_dir):
    return sorted(n for n in os.listdir(cache_dir) if not n.startswith("."))


# --- one conformance suite for every tier -------------------------------------------------------


@pytest.fixture(params=["memory", "disk"])
def tier(request, tmp_path):
    if request.param == "memory":
        return MemoryTier(10_000)
    return DiskTier(str(tmp_path / "cache"), 10_000)


class TestTierConformance:
    def test_roundtrip_and_counters(self, tier):
        data = bytes(range(256)) * 10
        assert tier.lookup("http://h/a.tar") is None
        assert put(tier, "http://h/a.tar", data)
        assert read(tier, "http://h/a.tar") == data
        assert tier.counters.snapshot()["bytes_written"] == len(data)

    def test_abort_keeps_nothing(self, tier):
        writer = tier.writer("http://h/a.tar")
        writer.write(b"x" * 100)
        writer.abort()
        assert tier.lookup("http://h/a.tar") is None
        assert writer.commit() is False  # an aborted writer cannot be committed afterwards
        assert tier.lookup("http://h/a.tar") is None
        assert tier.counters.snapshot()["discarded"] == 1

    def test_too_big_is_streamed_but_not_kept(self, tier):
        assert tier.writer("http://h/big.tar", size_hint=20_000) is None
        writer = tier.writer("http://h/big.tar")
        for _ in range(30):
            writer.write(b"y" * 1000)
        assert writer.commit() is False
        assert tier.lookup("http://h/big.tar") is None

    def test_told_a_size_too_big_it_gives_up_before_copying(self, tier):
        writer = tier.writer("http://h/big.tar")
        writer.write(b"y" * 1000)
        writer.reserve(20_000)  # (what an origin's stream says once its headers are in)
        assert writer.live is False and writer.commit() is False
        assert tier.lookup("http://h/big.tar") is None
        assert tier.counters.snapshot()["discarded"] == 1

    def test_pickles_as_configuration(self, tier):
        put(tier, "http://h/a.tar", b"abc")
        clone = pickle.loads(pickle.dumps(tier))
        assert (type(clone), clone.name, clone.max_bytes) == (type(tier), tier.name, tier.max_bytes)
        assert clone.counters.snapshot()["bytes_written"] == 0


# --- memory tier ---------------------------------------------------------------------------------


def test_memory_lru_bound_and_order():
    tier = MemoryTier(100)
    assert put(tier, "a", b"a" * 40) and put(tier, "b", b"b" * 40)
    assert read(tier, "a") == b"a" * 40  # a is now more recent than b
    assert put(tier, "c", b"c" * 40)
    assert "b" not in tier and "a" in tier and "c" in tier
    assert tier.nbytes == 80 and len(tier) == 2
    assert not tier.put("d", b"d" * 101)  # never kept: larger than the whole tier
    assert tier.nbytes == 80
    assert tier.put("e", [b"e" * 50, b"e" * 50])  # takes everything
    assert len(tier) == 1 and tier.nbytes == 100
    assert tier.counters.snapshot()["evictions"] == 3
    assert not MemoryTier(0).put("x", b"x") and MemoryTier(0).writer("x") is None


def test_memory_tier_is_thread_safe():
    tier = MemoryTier(5_000)

    def work(seed):
        for i in range(300):
            url = f"u{(seed * 7 + i) % 23}"
            tier.put(url, bytes([i % 256]) * (50 + i % 200))
            read(tier, url)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sizes = [len(read(tier, u)) for u in [f"u{i}" for i in range(23)] if u in tier]
    assert tier.nbytes == sum(sizes) <= 5_000


# --- disk tier -----------------------------------------------------------------------------------


def test_disk_names_never_collide_and_stay_readable(tmp_path):
    urls = [
        "http://a/train/shard-000.tar",
        "http://b/train/shard-000.tar",
        "http://a/val/shard-000.tar",
        "s3://bucket/train/shard-000.tar",
        "/local/train/shard-000.tar",
    ]
    names = [cache_file_name(u) for u in urls]
    assert len(set(names)) == len(urls)
    assert all(n.endswith("-shard-000.tar") and not n.startswith(".") for n in names)
    odd = cache_file_name("http://h/../../etc/pa ss?wd=1")
    assert "/" not in odd and " " not in odd and odd.endswith("-pa_ss")
    assert cache_file_name("http://h/").endswith("-shard")
    assert cache_file_name("pipe:curl -s http://h/x.tar") == cache_file_name("http://h/x.tar")
    tier = DiskTier(str(tmp_path), None)
    for i, url in enumerate(urls):
        put(tier, url, str(i).encode() * 10)
    assert [read(tier, u) for u in urls] == [str(i).encode() * 10 for i in range(len(urls))]
    assert all(os.path.dirname(tier.path_for(u)) == str(tmp_path) for u in urls)


def test_disk_commit_is_atomic(tmp_path):
    tier = DiskTier(str(tmp_path), None)
    url = "http://h/a.tar"
    writer = tier.writer(url)
    writer.write(b"half")
    # While a write is in progress only a hidden temp file exists: nothing can be served.
    assert tier.lookup(url) is None and not os.path.exists(tier.path_for(url))
    assert len(temp_files(tmp_path)) == 2  # the temp file and its progress log
    writer.write(b"-and-the-rest")
    assert writer.commit()
    assert read(tier, url) == b"half-and-the-rest" and temp_files(tmp_path) == []


def _write_then_die(cache_dir, url):
    tier = DiskTier(cache_dir, None)
    writer = tier.writer(url)
    writer.write(b"partial" * 1000)
    writer.thread.finish()  # written (the writer thread is done), not committed
    os.kill(os.getpid(), signal.SIGKILL)


def test_killed_writer_commits_nothing_and_its_temp_is_cleaned(tmp_path):
    url = "http://h/a.tar"
    proc = multiprocessing.get_context("fork").Process(target=_write_then_die, args=(str(tmp_path), url))
    proc.start()
    proc.join(10)
    assert proc.exitcode == -signal.SIGKILL
    assert len([n for n in temp_files(tmp_path) if f".{proc.pid}." in n]) == 2  # the temp file and its log
    tier = DiskTier(str(tmp_path), None)  # construction cleans up dead processes' temp files
    assert tier.lookup(url) is None and committed(tmp_path) == [] and temp_files(tmp_path) == []


def _dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_temp_cleanup_removes_dead_pids_only(tmp_path):
    tier = DiskTier(str(tmp_path), None)
    put(tier, "http://h/keep.tar", b"k" * 10)
    name = cache_file_name("http://h/x.tar")
    zombie = subprocess.Popen(["true"])
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # wait until it exited but is not reaped: a zombie
        with open(f"/proc/{zombie.pid}/stat", "rb") as f:
            if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                break
        time.sleep(0.01)
    files = {
        "live": f".{name}.{_HOST}.{os.getpid()}.0000000a.tmp",
        "dead": f".{name}.{_HOST}.{_dead_pid()}.0000000b.tmp",
        "zombie": f".{name}.{_HOST}.{zombie.pid}.0000000c.tmp",
        "other_host": f".{name}.{_HOST}x.{_dead_pid()}.0000000d.tmp",
    }
    for fname in files.values():
        (tmp_path / fname).write_bytes(b"junk")
    (tmp_path / f".{name}.meta").write_text("{}")  # an orphan sidecar: no committed shard
    tier.cleanup()
    zombie.wait()
    left = set(os.listdir(tmp_path))
    assert files["live"] in left and files["other_host"] in left
    assert files["dead"] not in left and files["zombie"] not in left
    assert f".{name}.meta" not in left
    assert read(tier, "http://h/keep.tar") == b"k" * 10


def test_byte_bound_evicts_least_recently_used(tmp_path):
    tier = DiskTier(str(tmp_path), 300)
    for name in "abc":
        put(tier, f"http://h/{name}.tar", name.encode() * 100)
    assert read(tier, "http://h/a.tar") == b"a" * 100  # a is touched: b is now the oldest
    put(tier, "http://h/d.tar", b"d" * 100)
    names = {u: os.path.exists(tier.path_for(f"http://h/{u}.tar")) for u in "abcd"}
    assert names == {"a": True, "b": False, "c": True, "d": True}
    put(tier, "http://h/e.tar", b"e" * 150)  # needs two evictions: c, then a
    assert [u for u in "abcde" if tier.lookup(f"http://h/{u}.tar")] == ["d", "e"]
    assert tier.committed_bytes() <= 300
    assert tier.counters.snapshot()["evictions"] == 3
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".meta") and n[1:-5] not in committed(tmp_path)]


def test_files_being_read_are_evicted_last(tmp_path):
    tier = DiskTier(str(tmp_path), 300)
    for name in "abc":
        put(tier, f"http://h/{name}.tar", name.encode() * 100)
    source = tier.lookup("http://h/a.tar")
    os.utime(tier.path_for("http://h/a.tar"), ns=(1, 1))  # oldest by far, but in use
    put(tier, "http://h/d.tar", b"d" * 100)
    assert os.path.exists(tier.path_for("http://h/a.tar")) and not os.path.exists(tier.path_for("http://h/b.tar"))
    assert b"".join(source) == b"a" * 100
    source.close()


def test_validation_rejects_corrupt_file_and_refetches(tmp_path):
    tier = DiskTier(str(tmp_path), None)
    url = "http://h/a.tar"
    data = os.urandom(5000)
    put(tier, url, data)
    with open(tier.path_for(url), "r+b") as f:  # truncated behind our back
        f.truncate(4000)
    assert tier.lookup(url) is None
    fetched = []

    def origin(u):
        fetched.append(u)
        yield data

    cache = ShardCache([tier])
    assert b"".join(cache.stream(url, origin)) == data and fetched == [url]
    assert tier.counters.snapshot()["invalid"] == 1
    assert read(tier, url) == data  # repaired: the next read is a hit
    os.unlink(tier._meta_path(tier.path_for(url)))  # no record of the size: never served either
    assert tier.lookup(url) is None
    assert b"".join(cache.stream(url, origin)) == data and len(fetched) == 2
