"""The disk tier's usage ledger (`_cache/usage.py`): commits count bytes without listing the
directory, and the bound is still kept across processes and against changes behind the cache's back."""

from __future__ import annotations

import os

import pytest
from cachehooks import put
from children import run_children

from shardstream._cache import usage
from shardstream._cache.disk import DiskTier
from shardstream._cache.usage import Usage, read_usage, write_usage


@pytest.fixture
def listings(monkeypatch):
    """The number of directory listings (`DiskTier._scan`) made since the fixture was set up."""
    calls = []
    real = DiskTier._scan

    def counted(self, *args, **kwargs):
        calls.append(self.cache_dir)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(DiskTier, "_scan", counted)
    return calls


def ledger(tier) -> Usage:
    found = read_usage(tier._usage_path)
    assert found is not None
    return found


def test_commits_below_the_bound_do_not_list_the_directory(tmp_path, listings):
    for bound in (None, 10_000):
        tier = DiskTier(str(tmp_path / str(bound)), bound)
        assert len(listings) == 1  # opening the tier cleans up: one listing
        for i in range(20):
            assert put(tier, f"http://h/{i}.tar", b"x" * 100)
        assert len(listings) == 1
        assert ledger(tier).total == 2_000 == tier.committed_bytes()
        listings.clear()


def test_the_bound_holds_across_processes_sharing_the_ledger(tmp_path, listings):
    first, second = DiskTier(str(tmp_path), 300), DiskTier(str(tmp_path), 300)  # two ranks of a node
    assert put(first, "http://h/a.tar", b"a" * 100)
    assert put(second, "http://h/b.tar", b"b" * 100)
    assert put(first, "http://h/c.tar", b"c" * 100)
    listings.clear()
    assert put(second, "http://h/d.tar", b"d" * 100)  # past the bound: a listing evicts the oldest
    assert len(listings) == 1
    assert [u for u in "abcd" if second.lookup(f"http://h/{u}.tar")] == ["b", "c", "d"]
    assert ledger(first).total == 300 == first.committed_bytes()


def test_a_recommitted_shard_counts_once(tmp_path):
    tier = DiskTier(str(tmp_path), None)
    assert put(tier, "http://h/a.tar", b"a" * 100)
    assert put(tier, "http://h/a.tar", b"A" * 120)  # replaces the file: 120 bytes, not 220
    assert ledger(tier).total == 120 == tier.committed_bytes()


@pytest.mark.parametrize("damage", ["missing", "garbled", "stale"])
def test_a_ledger_it_cannot_trust_makes_a_listing(tmp_path, listings, damage):
    tier = DiskTier(str(tmp_path), 10_000)
    assert put(tier, "http://h/a.tar", b"a" * 100)
    os.remove(tier.path_for("http://h/a.tar"))  # behind the cache's back: the ledger over-counts
    path = tier._usage_path
    if damage == "missing":
        os.remove(path)
    elif damage == "garbled":
        with open(path, "wb") as stream:
            stream.write(b"\x00not a number")
    else:
        write_usage(path, ledger(tier)._replace(listed_at=ledger(tier).listed_at - usage.RESCAN_S - 1))
    listings.clear()
    assert put(tier, "http://h/b.tar", b"b" * 100)
    assert len(listings) == 1
    assert ledger(tier).total == 100 == tier.committed_bytes()


def test_an_over_count_never_lets_the_directory_outgrow_its_bound(tmp_path):
    tier = DiskTier(str(tmp_path), 250)
    assert put(tier, "http://h/a.tar", b"a" * 100)
    assert put(tier, "http://h/b.tar", b"b" * 100)
    path = tier._usage_path
    write_usage(path, ledger(tier)._replace(total=240))  # over-counted (a file evicted as corrupt, say)
    assert put(tier, "http://h/c.tar", b"c" * 100)  # 340 by the ledger: the listing finds 300, evicts a
    assert [u for u in "abc" if tier.lookup(f"http://h/{u}.tar")] == ["b", "c"]
    assert ledger(tier).total == 200 == tier.committed_bytes()


def test_a_file_discarded_as_invalid_leaves_the_ledger(tmp_path):
    """A file found corrupt (or without a record that matches it) is taken off the ledger as it is
    removed: left on it, the next commits would evict good files to make room for a ghost."""
    tier = DiskTier(str(tmp_path), 350)
    for name in "abc":
        assert put(tier, f"http://h/{name}.tar", name.encode() * 100)
    source = tier.lookup("http://h/a.tar")
    assert tier.discard_corrupt(source)  # (what a reader that found a bad block does)
    source.close()
    assert ledger(tier).total == 200 == tier.committed_bytes()
    with open(tier.path_for("http://h/b.tar"), "ab") as f:
        f.write(b"x")  # its size no longer matches its record
    assert tier.lookup("http://h/b.tar", repair=True) is None
    assert ledger(tier).total == 100 == tier.committed_bytes()
    for name in "ad":  # 300 with both back: within the bound, so c stays
        assert put(tier, f"http://h/{name}.tar", name.encode() * 100)
    assert [u for u in "abcd" if tier.lookup(f"http://h/{u}.tar")] == ["a", "c", "d"]
    assert ledger(tier).total == 300 == tier.committed_bytes()


def test_a_full_cache_evicts_without_listing_each_commit(tmp_path, listings):
    """At its bound (a cache smaller than the data set) a commit evicts the oldest files the last
    listing saw: one listing serves many commits, and the order is still exact LRU."""
    tier = DiskTier(str(tmp_path), 1_000)
    for i in range(10):
        assert put(tier, f"http://h/{i}.tar", b"x" * 100)
    listings.clear()
    assert put(tier, "http://h/10.tar", b"x" * 100)  # the first commit past the bound lists the directory
    assert len(listings) == 1
    assert read_kept(tier, 11) == list(range(1, 11))
    hit = tier.lookup("http://h/5.tar")  # a hit touches 5: it is now the newest
    assert hit is not None
    hit.close()
    os.utime(tier.path_for("http://h/5.tar"), ns=(2**62, 2**62))  # (later than any clock tick here)
    for i in range(11, 17):
        assert put(tier, f"http://h/{i}.tar", b"x" * 100)
    assert len(listings) == 1  # six more commits, each evicting the oldest, without a listing
    assert read_kept(tier, 17) == [5, 8, 9, 10, 11, 12, 13, 14, 15, 16]
    assert ledger(tier).total == 1_000 == tier.committed_bytes()


def read_kept(tier, count):
    return [i for i in range(count) if os.path.exists(tier.path_for(f"http://h/{i}.tar"))]


def _commit_many(cache_dir, rank, count):
    tier = DiskTier(cache_dir, 2_000)
    for i in range(count):
        assert put(tier, f"http://h/{rank}-{i}.tar", bytes([rank]) * (100 + 10 * i))


def test_processes_committing_together_keep_the_bound_and_the_ledger_exact(tmp_path):
    """Four processes commit into one bounded directory at once: every commit's read-modify-write
    of the ledger happens under the node-wide evict lock, so none is lost and the bound holds."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_commit_many, args=(str(tmp_path), rank, 30)) for rank in range(4)]
    run_children(procs, [], 60)
    counted = read_usage(os.path.join(str(tmp_path), ".locks", "usage"))  # (opening a tier would list and rewrite it)
    on_disk = sum(entry.stat().st_size for entry in os.scandir(tmp_path) if not entry.name.startswith("."))
    assert counted is not None and counted.total == on_disk <= 2_000
