"""Cache integrity end to end: WebDataset over the test HTTP server with `cache_dir=`, cached
shards corrupted at the same size (header, payload, trailer), alone, with two processes sharing
the cache, and around the offset where a resume enters a cached shard; plus the cache layer's own
cases (old records, a changed origin, a failing origin, a corrupt file that may not be evicted)
and the block digest."""

from __future__ import annotations

import bz2
import errno
import gzip
import hashlib
import io
import json
import logging
import lzma
import multiprocessing
import os
import pickle
import random
import tarfile
import time
import warnings
import zlib

import pytest
from children import run_children
from shardsets import payload_digests, write_served
import xxhash

import shardstream as wds
from shardstream import CorruptCacheFile
from shardstream._cache.check import BlockDigest
from shardstream._cache.naming import _file_lock, cache_file_name
from shardstream._cache.disk import DiskTier
from shardstream._cache.memory import CHUNK_SIZE
from shardstream._cache.shardcache import ShardCache

pytestmark = pytest.mark.timeout(60)
warnings.filterwarnings("ignore", message=".*shardshuffle.*")

SAMPLES, PAYLOAD = 12, 256 << 10  # about 3 MiB a shard: four 1 MiB CRC blocks
NAMES = ["shard-0.tar", "shard-1.tar"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("served")
    return str(root), write_served(str(root), NAMES, SAMPLES, PAYLOAD)


def _where(data: bytes, part: str) -> int:
    """A byte offset inside the shard: the first header, a payload in the middle, or the
    end-of-archive blocks."""
    members = tarfile.open(fileobj=io.BytesIO(data)).getmembers()
    if part == "header":
        return members[0].offset + 10  # inside the first member's name field
    if part == "payload":
        middle = members[len(members) // 2 + 1]  # a .bin member past the second block
        return middle.offset_data + 1000
    last = members[-1]
    return last.offset_data + -(-last.size // 512) * 512 + 100  # in the first end-of-archive block


def _corrupt(path: str, offset: int, length: int = 16) -> None:
    """Flip `length` bytes at `offset`, keeping the file's size."""
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(offset)
        old = f.read(length)
        f.seek(offset)
        f.write(bytes(b ^ 0xFF for b in old))
    assert os.path.getsize(path) == size


def _digests(samples):
    return payload_digests(samples)


def _expected(files):
    root = files[0]
    return _digests(wds.WebDataset([os.path.join(root, n) for n in NAMES], shardshuffle=False))


def _fetched_once(shard: bytes, before, after) -> None:
    """The server sent the first shard once more (whatever requests it took) and nothing else."""
    assert after.path_requests[NAMES[0]] > before.path_requests[NAMES[0]]
    assert after.path_requests[NAMES[1]] == before.path_requests[NAMES[1]]
    assert len(shard) <= after.bytes_sent - before.bytes_sent < len(shard) + (64 << 10)


def _read(urls, cache_dir):
    it = iter(wds.WebDataset(urls, shardshuffle=False, cache_dir=cache_dir))
    return _digests(it), it.stats().cache


@pytest.mark.parametrize("part", ["header", "payload", "trailer"])
def test_same_size_corruption_is_evicted_and_fetched_again(server, files, tmp_path, caplog, part):
    urls = [server.url(n) for n in NAMES]
    cache_dir = str(tmp_path)
    expected = _expected(files)
    first, _ = _read(urls, cache_dir)
    assert first == expected
    cached = os.path.join(cache_dir, cache_file_name(urls[0]))
    _corrupt(cached, _where(files[1][NAMES[0]], part))
    before = server.stats.snapshot()

    with caplog.at_level(logging.WARNING, logger="shardstream"):
        second, stats = _read(urls, cache_dir)
    assert second == expected  # never the corrupt bytes, and nothing missing or repeated
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(cached in m and "evicted" in m for m in warned), warned
    after = server.stats.snapshot()
    _fetched_once(files[1][NAMES[0]], before, after)
    assert stats["disk"]["corrupt"] == 1 and stats["origin"]["fetches"] == 1

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="shardstream"):
        third, stats = _read(urls, cache_dir)  # repaired: all hits, nothing fetched, no warning
    assert third == expected and stats["disk"]["hits"] == len(NAMES) and stats["origin"]["fetches"] == 0
    assert server.stats.snapshot().path_requests == after.path_requests and not caplog.records
    with open(cached, "rb") as f:
        assert f.read() == files[1][NAMES[0]]


def test_error_names_the_cache_file_when_the_origin_fails_too(server, files, tmp_path, caplog):
    url = server.url(NAMES[0], token="hunter2")
    cache_dir = str(tmp_path)
    assert len(_read([url], cache_dir)[0]) == SAMPLES
    cached = os.path.join(cache_dir, cache_file_name(url))
    _corrupt(cached, _where(files[1][NAMES[0]], "payload"))
    server.options.fail_first = {NAMES[0]: 1000}
    options = wds.FetchOptions(retries=1, backoff_base=0.01, backoff_max=0.02)
    got = []
    with pytest.raises(wds.FetchError) as info, caplog.at_level(logging.WARNING, logger="shardstream"):
        for sample in wds.WebDataset([url], shardshuffle=False, cache_dir=cache_dir, fetch_options=options):
            got.append(sample)
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert cached in logged and "token=***" in logged and "hunter2" not in logged
    message = str(info.value)
    assert cached in message and "hunter2" not in message and "token=***" in message
    assert isinstance(info.value, CorruptCacheFile) and info.value.cache_path == cached
    expected = _expected(files)[:SAMPLES]
    assert _digests(got) == expected[: len(got)] and 0 < len(got) < SAMPLES  # only good samples, in order
    assert not os.path.exists(cached)  # evicted all the same


@pytest.mark.parametrize("where", ["after", "at", "before"])
def test_a_resume_mid_shard_checks_the_cached_blocks_it_parses(server, files, tmp_path, caplog, where):
    """A resume enters the cached shard at the saved offset (in its second block). A corrupt block
    after it, or the one holding it, is caught before it is parsed, evicted and fetched again as
    for a hit read from the start, and the samples after the checkpoint are delivered once each; a
    corrupt block before it is never parsed, so never looked at: no request, no warning."""
    urls = [server.url(n) for n in NAMES]
    cache_dir = str(tmp_path)
    expected = _expected(files)
    assert _read(urls, cache_dir)[0] == expected  # fills the cache
    data = files[1][NAMES[0]]
    members = tarfile.open(fileobj=io.BytesIO(data)).getmembers()
    block = CHUNK_SIZE

    ds = wds.WebDataset(urls, shardshuffle=False, cache_dir=cache_dir)
    it = iter(ds)
    first = [next(it) for _ in range(5)]
    state = ds.state_dict()
    del it
    offset = state["position"][3]
    assert state["position"][1:3] == [0, 5] and offset == members[10].offset and offset // block == 1
    member, bad_block = {"after": (19, 2), "at": (10, 1), "before": (1, 0)}[where]
    bad = members[member].offset_data + 1000  # in a .bin payload
    assert bad // block == bad_block
    cached = os.path.join(cache_dir, cache_file_name(urls[0]))
    _corrupt(cached, bad)
    before = server.stats.snapshot()

    resumed = wds.WebDataset(urls, shardshuffle=False, cache_dir=cache_dir)
    resumed.load_state_dict(state)
    with caplog.at_level(logging.WARNING, logger="shardstream"):
        rest_it = iter(resumed)
        rest = _digests(rest_it)
    stats = rest_it.stats().cache
    assert _digests(first) + rest == expected  # nothing corrupt, missing or repeated
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    after = server.stats.snapshot()
    if where != "before":
        assert any(cached in m and "evicted" in m for m in warned), warned
        _fetched_once(data, before, after)  # the re-read starts at byte 0 and refills the cache
        assert stats["disk"]["corrupt"] == 1 and stats["origin"]["fetches"] == 1
        with open(cached, "rb") as f:
            assert f.read() == data
    else:
        assert not warned and after.path_requests == before.path_requests
        assert stats["disk"]["corrupt"] == 0 and stats["disk"]["hits"] == 2 and stats["origin"]["fetches"] == 0
        # the blocks from the one holding the offset were checked, not the one before it
        assert stats["disk"]["bytes_served"] == len(data) - block + len(files[1][NAMES[1]])


# --- two processes sharing one cache directory ---------------------------------------------------


def _read_in_child(urls, cache_dir, barrier, out_path):
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logging.getLogger("shardstream").addHandler(Keep(logging.WARNING))
    warnings.filterwarnings("ignore")
    barrier.wait(30)
    samples, stats = _read(urls, cache_dir)
    with open(out_path + ".part", "w") as f:
        json.dump({"samples": samples, "stats": stats, "warnings": records}, f)
    os.replace(out_path + ".part", out_path)


def test_two_processes_share_one_refetch_of_a_corrupt_file(server, files, tmp_path):
    urls = [server.url(n) for n in NAMES]
    cache_dir = str(tmp_path / "cache")
    os.makedirs(cache_dir)
    expected = _expected(files)
    assert _read(urls, cache_dir)[0] == expected
    cached = os.path.join(cache_dir, cache_file_name(urls[0]))
    _corrupt(cached, _where(files[1][NAMES[0]], "payload"))
    before = server.stats.snapshot()

    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    outs = [str(tmp_path / f"out{n}.json") for n in range(2)]
    procs = [ctx.Process(target=_read_in_child, args=(urls, cache_dir, barrier, out)) for out in outs]
    results = run_children(procs, outs, 45)
    for result in results:
        assert [tuple(s) for s in result["samples"]] == expected
    _fetched_once(files[1][NAMES[0]], before, server.stats.snapshot())  # not once per process
    warned = [m for result in results for m in result["warnings"]]
    assert any(cached in m and "evicted it" in m for m in warned), warned
    with open(cached, "rb") as f:
        assert f.read() == files[1][NAMES[0]]


def _stream_in_child(cache_dir, url, data, barrier, log_path, out_path):
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logging.getLogger("shardstream").addHandler(Keep(logging.WARNING))

    def slow_origin(u):
        with open(log_path, "a") as f:
            f.write(f"{os.getpid()}\n")
        for i in range(0, len(data), CHUNK):
            time.sleep(0.01)  # the other process reaches the claim while this one is fetching
            yield data[i : i + CHUNK]

    stream = ShardCache([DiskTier(cache_dir, None, chunk_size=CHUNK)]).stream(url, slow_origin)
    got = [next(stream)]
    barrier.wait(20)  # both hold the corrupt file open before either finds the bad block
    got += list(stream)
    with open(out_path, "w") as f:
        json.dump({"ok": b"".join(got) == data, "warnings": records}, f)


def test_two_processes_reading_one_corrupt_file_fetch_it_once(tmp_path):
    data = os.urandom(8 * CHUNK)
    url = "http://h/a.tar"
    _tier, _cache, path = _filled(tmp_path / "cache", data)
    _corrupt(path, 2 * CHUNK + 5, 1)
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(2)
    log_path = str(tmp_path / "origin.log")
    outs = [str(tmp_path / f"out{n}.json") for n in range(2)]
    procs = [
        ctx.Process(target=_stream_in_child, args=(str(tmp_path / "cache"), url, data, barrier, log_path, out))
        for out in outs
    ]
    results = run_children(procs, outs, 30)
    assert all(r["ok"] for r in results)
    assert len(open(log_path).read().split()) == 1  # one fetch between them
    warned = sorted(m for r in results for m in r["warnings"])
    assert len(warned) == 2 and all(path in m for m in warned)
    assert "evicted it" in warned[1] and "another process already evicted or replaced it" in warned[0]
    assert open(path, "rb").read() == data


# --- the cache layer -----------------------------------------------------------------------------


CHUNK = 4096


class Origin:
    """An in-memory origin that counts fetches; `data` may be swapped (a changed shard)."""

    def __init__(self, data: bytes, fail: bool = False):
        self.data, self.fail, self.fetches = data, fail, 0

    def __call__(self, url):
        self.fetches += 1
        return self._chunks(url)

    def _chunks(self, url):
        if self.fail:
            raise wds.ShardNotFound("gone", url=url)
        for i in range(0, len(self.data), 3000):  # not aligned with the cache's blocks
            yield self.data[i : i + 3000]


def _filled(tmp_path, data, url="http://h/a.tar", **kw):
    tier = DiskTier(str(tmp_path), None, chunk_size=CHUNK, **kw)
    cache = ShardCache([tier])
    assert b"".join(cache.stream(url, Origin(data))) == data
    return tier, cache, tier.path_for(url)


def test_the_record_holds_a_digest_per_block(tmp_path):
    data = os.urandom(5 * CHUNK + 123)
    tier, _, path = _filled(tmp_path, data)
    record = tier.record("http://h/a.tar")
    assert record.size == len(data) and record.block_size == CHUNK
    assert list(record.crcs) == [xxhash.xxh3_64_intdigest(data[i : i + CHUNK]) for i in range(0, len(data), CHUNK)]


def test_hits_are_checked_block_by_block_before_they_are_handed_out(tmp_path):
    data = os.urandom(5 * CHUNK)
    tier, _, path = _filled(tmp_path, data)
    _corrupt(path, 3 * CHUNK + 7, 1)
    source = tier.lookup("http://h/a.tar")
    got = []
    with pytest.raises(CorruptCacheFile) as info:
        for block in source:
            got.append(block)
    source.close()
    assert b"".join(got) == data[: 3 * CHUNK]  # the blocks before the bad one, never the bad one
    assert info.value.cache_path == path and path in str(info.value) and info.value.bad_offset == 3 * CHUNK
    clone = pickle.loads(pickle.dumps(info.value))
    assert (clone.cache_path, str(clone)) == (path, str(info.value))


def test_a_stream_goes_on_seamlessly_from_the_origin(tmp_path, caplog):
    data = os.urandom(5 * CHUNK + 99)
    tier, cache, path = _filled(tmp_path, data)
    _corrupt(path, len(data) - 50, 1)  # the last, short block
    origin = Origin(data)
    with caplog.at_level(logging.WARNING, logger="shardstream"):
        assert b"".join(cache.stream("http://h/a.tar", origin)) == data
    assert origin.fetches == 1 and any(path in r.getMessage() for r in caplog.records)
    assert open(path, "rb").read() == data and tier.counters.snapshot()["corrupt"] == 1
    assert b"".join(cache.stream("http://h/a.tar", origin)) == data and origin.fetches == 1


def test_a_shard_that_changed_at_the_origin_is_an_error_naming_the_cache_file(tmp_path):
    data = os.urandom(5 * CHUNK)
    _tier, cache, path = _filled(tmp_path, data)
    _corrupt(path, 4 * CHUNK, 1)
    changed = bytes([data[0] ^ 1]) + data[1:]
    got = []
    with pytest.raises(CorruptCacheFile, match="differs") as info:
        for chunk in cache.stream("http://h/a.tar", Origin(changed)):
            got.append(chunk)
    assert b"".join(got) == data[: 4 * CHUNK] and info.value.cache_path == path and path in str(info.value)
    shorter = data[: 2 * CHUNK]
    _filled(tmp_path / "b", data)
    cache_b = ShardCache([DiskTier(str(tmp_path / "b"), None, chunk_size=CHUNK)])
    _corrupt(cache_b.tiers[0].path_for("http://h/a.tar"), 3 * CHUNK, 1)
    with pytest.raises(CorruptCacheFile, match="differs"):
        list(cache_b.stream("http://h/a.tar", Origin(shorter)))


def test_a_read_error_is_handled_like_corruption(tmp_path, caplog):
    data = os.urandom(3 * CHUNK)
    tier, cache, path = _filled(tmp_path, data)
    real_lookup = tier.lookup

    class FailingDisk:  # the second block read fails with EIO
        def __init__(self, f):
            self.f, self.reads = f, 0

        def read(self, n):
            self.reads += 1
            if self.reads == 2:
                raise OSError(errno.EIO, "Input/output error")
            return self.f.read(n)

        def close(self):
            self.f.close()

    def lookup(url, **kw):
        source = real_lookup(url, **kw)
        if source is not None and not tier.counters.snapshot()["corrupt"]:
            source.file = FailingDisk(source.file)
        return source

    tier.lookup = lookup
    origin = Origin(data)
    with caplog.at_level(logging.WARNING, logger="shardstream"):
        assert b"".join(cache.stream("http://h/a.tar", origin)) == data
    assert origin.fetches == 1 and tier.counters.snapshot()["corrupt"] == 1
    assert any(path in r.getMessage() and "Input/output error" in r.getMessage() for r in caplog.records)


def test_a_failing_origin_after_a_corrupt_file_names_the_cache_file(tmp_path):
    data = os.urandom(3 * CHUNK)
    _tier, cache, path = _filled(tmp_path, data)
    _corrupt(path, 10, 1)
    with pytest.raises(CorruptCacheFile) as info:
        list(cache.stream("http://h/a.tar", Origin(data, fail=True)))
    assert path in str(info.value) and isinstance(info.value.__cause__, wds.ShardNotFound)
    assert not os.path.exists(path) and cache.stats()["origin"]["errors"] == 1


@pytest.mark.parametrize("old", ["size only", "crc32"])
def test_a_file_without_a_digest_is_fetched_again(tmp_path, caplog, old):
    data = os.urandom(2 * CHUNK)
    tier, cache, path = _filled(tmp_path, data)
    meta = tier._meta_path(path)
    record = {"size": len(data), "url_sha256": hashlib.sha256(b"http://h/a.tar").hexdigest()}
    if old == "crc32":  # format 2: a CRC-32 per block, right for the file but no longer trusted
        crcs = [zlib.crc32(data[i : i + CHUNK]) for i in range(0, len(data), CHUNK)]
        record.update(format=2, block_size=CHUNK, crc32=b"".join(c.to_bytes(4, "big") for c in crcs).hex())
    with open(meta, "w") as f:  # what an earlier version wrote
        json.dump(record, f)
    assert tier.lookup("http://h/a.tar") is None and cache.local_path("http://h/a.tar") is None
    origin = Origin(data)
    with caplog.at_level(logging.INFO, logger="shardstream"):
        assert b"".join(cache.stream("http://h/a.tar", origin)) == data
    assert origin.fetches == 1 and any("no recorded digest" in r.getMessage() for r in caplog.records)
    assert tier.record("http://h/a.tar").crcs is not None and tier.lookup("http://h/a.tar") is not None


def test_without_the_claim_a_corrupt_file_is_not_evicted_but_never_served(tmp_path, caplog):
    data = os.urandom(4 * CHUNK)
    url = "http://h/a.tar"
    tier, cache, path = _filled(tmp_path, data, lock_timeout=0.3, stall_timeout=None)
    _corrupt(path, 2 * CHUNK, 1)
    holder = _file_lock(os.path.join(str(tmp_path), ".locks", cache_file_name(url)))
    holder.acquire()  # another process is (say) downloading it: we may not touch the file
    try:
        origin = Origin(data)
        start = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="shardstream"):
            assert b"".join(cache.stream(url, origin)) == data
        assert time.monotonic() - start < 5 and origin.fetches == 1
    finally:
        holder.release()
    warned = [r.getMessage() for r in caplog.records]
    assert os.path.exists(path) and any("not evicted" in m and path in m for m in warned)
    assert b"".join(cache.stream(url, origin)) == data and origin.fetches == 2  # now evicted and repaired
    assert open(path, "rb").read() == data


def test_block_digest_ignores_chunk_boundaries():
    rng = random.Random(0)
    data = rng.randbytes(10 * 1000 + 17)
    expected = [xxhash.xxh3_64_intdigest(data[i : i + 1000]) for i in range(0, len(data), 1000)]
    for _ in range(50):
        digest, pos = BlockDigest(1000), 0
        while pos < len(data):
            step = rng.choice([1, 7, 999, 1000, 1001, 2500, 5000])
            digest.update(data[pos : pos + step])
            pos += step
        assert digest.finish() == expected


def test_a_mapped_hit_checks_each_block_before_it_is_parsed_and_rereads_keeping_checked_blocks(tmp_path):
    data = os.urandom(6 * CHUNK + 100)
    url = "http://h/a.tar"
    _tier, cache, path = _filled(tmp_path, data)
    _corrupt(path, 3 * CHUNK + 9, 1)
    hit = cache.open_mapped(url)
    mapped = bytearray(open(path, "rb").read())
    hit.check(memoryview(mapped), 3 * CHUNK)  # blocks 0-2 are good
    with pytest.raises(CorruptCacheFile) as info:
        hit.check(memoryview(mapped), 3 * CHUNK + 1)  # block 3 is not: nothing of it may be parsed
    assert info.value.bad_offset == 3 * CHUNK and hit.checked == 3 * CHUNK
    hit.close()
    # The re-read hands on the whole shard from byte 0, each of the blocks checked before once
    # checked again (against the record) before it is handed on.
    origin = Origin(data)
    assert b"".join(cache.reread(url, origin, info.value)) == data
    assert origin.fetches == 1 and open(path, "rb").read() == data

    _corrupt(path, 4 * CHUNK, 1)
    hit = cache.open_mapped(url)
    with pytest.raises(CorruptCacheFile) as info:
        hit.check(memoryview(bytearray(open(path, "rb").read())), len(data))
    hit.close()
    changed = data[: CHUNK + 5] + bytes([data[CHUNK + 5] ^ 1]) + data[CHUNK + 6 :]  # block 1 differs
    got = []
    with pytest.raises(CorruptCacheFile, match="differs"):
        for chunk in cache.reread(url, Origin(changed), info.value):
            got.append(chunk)
    assert b"".join(got) == data[:CHUNK]  # only the block that matched was handed on


def test_a_mapped_hit_opened_mid_shard_checks_from_the_block_holding_its_start(tmp_path):
    data = os.urandom(6 * CHUNK + 100)
    url = "http://h/a.tar"
    tier, cache, path = _filled(tmp_path, data)
    _corrupt(path, 9, 1)  # block 0: before the start, never parsed, so never checked
    _corrupt(path, 4 * CHUNK + 9, 1)
    hit = cache.open_mapped(url, start=2 * CHUNK + 100)
    assert hit.checked == 2 * CHUNK
    mapped = memoryview(bytearray(open(path, "rb").read()))
    hit.check(mapped, 4 * CHUNK)  # blocks 2-3 are good
    with pytest.raises(ValueError):
        hit.check_from(0)  # only before the first check
    with pytest.raises(CorruptCacheFile) as info:
        hit.check(mapped, 4 * CHUNK + 1)
    assert info.value.bad_offset == 4 * CHUNK and tier.counters.snapshot()["bytes_served"] == 2 * CHUNK
    hit.close()
    # The re-read compares the fresh copy with the record in every block before the bad one
    # (block 0 included, which the map skipped): the origin's good copy passes...
    origin = Origin(data)
    assert b"".join(cache.reread(url, origin, info.value)) == data
    assert origin.fetches == 1 and open(path, "rb").read() == data
    # ...and a copy that changed before the start is refused.
    _corrupt(path, 4 * CHUNK + 9, 1)
    hit = cache.open_mapped(url, start=2 * CHUNK)
    with pytest.raises(CorruptCacheFile) as info:
        hit.check(memoryview(bytearray(open(path, "rb").read())), len(data))
    hit.close()
    changed = bytes([data[0] ^ 1]) + data[1:]
    with pytest.raises(CorruptCacheFile, match="differs"):
        b"".join(cache.reread(url, Origin(changed), info.value))


def _cut_tar(members: int, zero_data: bool = False) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for i in range(members):
            info = tarfile.TarInfo(f"{'long-' * 30 if i == 1 else ''}s{i:04d}.bin")  # (a PAX path record)
            info.size = 300_000
            tar.addfile(info, io.BytesIO(bytes([0 if zero_data else i]) * info.size))
        link = tarfile.TarInfo("z.lnk")
        link.type, link.linkname = tarfile.SYMTYPE, "s0000.bin"
        tar.addfile(link)
    return buf.getvalue()


# (name, how the origin's first body is made from the whole tar, whether pass 1 yields all samples)
_CUTS = {
    "member-boundary": lambda whole, last: whole[:last],
    "mid-member": lambda whole, last: whole[: last - 1000],
    "inside-the-first-block": lambda whole, last: whole[:300],
    "empty-body": lambda whole, last: b"",
}


class _Vault:
    """A fetcher of our own for `scheme` that serves `blobs` by URL in chunks of `chunk` bytes
    without stating a length (a close-delimited body, as far as the cache can tell), counting
    its fetches; `read(url)` is a pass through a cache in `cache_dir`."""

    def __init__(self, scheme: str, blobs: dict, cache_dir, chunk: int = 1 << 30) -> None:
        self.scheme, self.blobs, self.cache_dir, self.chunk = scheme, blobs, str(cache_dir), chunk
        self.fetched: list = []

    async def _fetch(self, url, *, options, start=0):
        self.fetched.append(url)
        body = self.blobs[url]
        for i in range(start, len(body), self.chunk):
            yield body[i:i + self.chunk]

    def read(self, url: str) -> list:
        dataset = wds.WebDataset(url, shardshuffle=False, cache_dir=self.cache_dir, empty_check=False)
        return [s["__key__"] for s in dataset]

    def __enter__(self) -> "_Vault":
        self._previous = wds.register_fetcher(self.scheme, self._fetch)
        return self

    def __exit__(self, *exc) -> None:
        wds.register_fetcher(self.scheme, self._previous)


@pytest.mark.parametrize("cut", sorted(_CUTS) + ["mid-member-of-zeros"])
@pytest.mark.parametrize("members", [4, 12])  # (under one tee batch of 1 MiB, and over three)
def test_a_shard_cut_short_without_an_error_is_read_but_not_cached(tmp_path, caplog, cut, members):
    """A body cut short that its transport cannot tell from a whole one (a close-delimited HTTP
    body, a fetcher that stops early) was committed to the cache: every later pass read the cut
    copy from it, although the origin had the whole shard again. Now a plain tar is walked header
    to header, and one that stops before its end-of-archive block reads to its end (or its error)
    but is not kept (nor a body too short to be a tar), even where its last bytes are zeros."""
    whole = _cut_tar(members, zero_data=cut == "mid-member-of-zeros")
    with tarfile.open(fileobj=io.BytesIO(whole)) as tar:
        names = [m.name for m in tar.getmembers() if m.isfile()]
        last = tar.getmembers()[-2].offset  # the last file's header: a cut at a member boundary
    keys = [name[: -len(".bin")] for name in names]
    url = "cutvault://b/a.tar"
    with _Vault("cutvault", {url: _CUTS.get(cut, _CUTS["mid-member"])(whole, last)}, tmp_path) as vault:
        with caplog.at_level(logging.WARNING):
            if cut == "member-boundary":
                assert vault.read(url) == keys[:-1]
            else:
                with pytest.raises(wds.FormatError):
                    vault.read(url)
        assert any("not cached" in r.getMessage() and url in r.getMessage() for r in caplog.records)
        vault.blobs[url] = whole  # the origin whole again: read from it, then cached
        assert vault.read(url) == keys and len(vault.fetched) == 2
        assert vault.read(url) == keys and len(vault.fetched) == 2  # a hit


@pytest.mark.parametrize("cut", [None, "in-the-member", "at-its-end"])
def test_a_pax_size_is_applied_when_the_cache_walks_a_shard(tmp_path, caplog, cut):
    """A member over 8 GiB has its size in a PAX record (the header's field cannot hold it;
    here it is zeroed): the walk stepped by the field, walked off the headers, gave up and kept
    a shard cut short inside such a member. Now it applies the record, as the reader does."""
    from tarvectors import VECTORS

    whole = VECTORS["pax_size_override"]
    with tarfile.open(fileobj=io.BytesIO(whole)) as tar:
        member = [m for m in tar.getmembers() if m.name == "overridden.bin"][0]
    ends = {None: len(whole), "in-the-member": member.offset_data + 400, "at-its-end": member.offset_data + member.size}
    url = "paxvault://b/a.tar"
    with _Vault("paxvault", {url: whole[: ends[cut]]}, tmp_path, chunk=300) as vault:  # (records split between chunks)
        with caplog.at_level(logging.WARNING):
            if cut is None:
                assert vault.read(url) == ["a", "overridden", "b"] == vault.read(url)
            else:
                with pytest.raises(wds.FormatError):
                    vault.read(url)
        assert len(vault.fetched) == 1  # (whole: the second read is a hit)
        told = [r for r in caplog.records if "not cached" in r.getMessage()]
        assert bool(told) == (cut is not None)


_CODECS = {"gz": gzip.compress, "xz": lzma.compress, "bz2": bz2.compress}


@pytest.mark.parametrize("cut", ["mid-stream", "in-the-trailer", "in-the-magic"])
@pytest.mark.parametrize("codec", sorted(_CODECS))
def test_a_compressed_shard_cut_short_without_an_error_is_not_cached(tmp_path, caplog, codec, cut):
    """A gzip, xz or bzip2 shard cut short by a transport that could not tell was committed to
    the cache: the cache did not inflate, so every later pass failed on the cut copy. Now its
    stream is inflated as it is written and its tar walked: it is kept only when the member that
    holds the end-of-archive block came to its trailer. Cut anywhere, it fails as without a cache
    and is fetched again; whole, it is fetched once."""
    whole = _CODECS[codec](_cut_tar(3))
    url = f"zvault://b/a.tar.{codec}"
    cuts = {"mid-stream": whole[: len(whole) // 2], "in-the-trailer": whole[:-3], "in-the-magic": whole[:1]}
    with _Vault("zvault", {url: cuts[cut]}, tmp_path, chunk=7777) as vault:
        with caplog.at_level(logging.WARNING):
            with pytest.raises(wds.FormatError):
                vault.read(url)
        assert [r for r in caplog.records if "not cached" in r.getMessage() and url in r.getMessage()]
        vault.blobs[url] = whole
        keys = ["s0000", "long-" * 30 + "s0001", "s0002"]
        assert vault.read(url) == keys and len(vault.fetched) == 2
        assert vault.read(url) == keys and len(vault.fetched) == 2  # a hit


_WRAPS = {  # how the shard is made from the tar and the bytes after it
    "plain": lambda tar, after: tar + after,
    "gz": lambda tar, after: gzip.compress(tar + after),
    "after-the-gz": lambda tar, after: gzip.compress(tar) + after,
    "after-the-bz2": lambda tar, after: bz2.compress(tar) + after,
}


@pytest.mark.parametrize("after", [b"", b"SIGNATURE-v1", b"X" * 512, b"\0" * 100])
@pytest.mark.parametrize("wrap", sorted(_WRAPS))
def test_a_whole_shard_is_cached_whatever_follows_its_end_of_archive(tmp_path, caplog, after, wrap):
    """The reader stops at the end-of-archive block and reads past what follows (record padding,
    a signature), inside a compressed stream or after it; the cache judges the same way, and
    keeps such a shard (it inflated the bytes after a compressed stream before it had walked to
    the end of the archive, took them for a corrupt member and kept nothing)."""
    whole = _WRAPS[wrap](_cut_tar(3), after)
    url = "wholevault://b/a.tar" + ("" if wrap == "plain" else ".bz2" if "bz2" in wrap else ".gz")
    with _Vault("wholevault", {url: whole}, tmp_path, chunk=7777) as vault:  # (headers split between chunks)
        with caplog.at_level(logging.WARNING):
            for _ in range(2):
                assert vault.read(url) == ["s0000", "long-" * 30 + "s0001", "s0002"]
        assert len(vault.fetched) == 1 and not [r for r in caplog.records if "not cached" in r.getMessage()]


def test_a_shard_whose_length_the_origin_stated_is_kept_as_the_origin_has_it(tmp_path, caplog):
    """The header walk is for streams without a stated length: over HTTP the fetcher checks
    Content-Length (a short body is retried, then an error), so a shard that lacks its
    end-of-archive blocks at the origin itself is cached as it is there, fetched once; the reader
    warns that it ends early, as it does without a cache."""
    from shardserver import ShardServer

    whole = _cut_tar(3)
    with tarfile.open(fileobj=io.BytesIO(whole)) as tar:
        last = tar.getmembers()[-2].offset
    served = tmp_path / "served"
    served.mkdir()
    (served / "a.tar").write_bytes(whole[:last])  # the origin's own copy stops at a member boundary
    cache = tmp_path / "cache"
    cache.mkdir()
    with ShardServer(str(served)) as srv, caplog.at_level(logging.WARNING):
        for _ in range(2):
            dataset = wds.WebDataset(srv.url("a.tar"), shardshuffle=False, cache_dir=str(cache))
            assert [s["__key__"] for s in dataset] == ["s0000", "long-" * 30 + "s0001"]
        assert srv.stats.snapshot().fetches["a.tar"] == 1
    assert not [r for r in caplog.records if "not cached" in r.getMessage()]
    assert [r for r in caplog.records if "end-of-archive" in r.getMessage()]


def _truncate_while_reading_in_child(urls, cache_dir, victim, out_path):
    """Read `urls`; after the first sample, cut `victim` (the file being read, memory-mapped) to
    a third, then read on. Touching a mapped page past a file's end is a SIGBUS: the child dies
    unless the reader looks at the file's size before each part of it is touched."""
    got, error = [], None
    try:  # (without the engine's reader thread, which would be anywhere in the file when it is cut)
        for sample in wds.WebDataset(urls, shardshuffle=False, cache_dir=cache_dir).with_engine(enabled=False):
            if not got:
                os.truncate(victim, os.path.getsize(victim) // 3)
            got.append(sample)
    except wds.FetchError as exn:
        error = str(exn)
    with open(out_path, "w") as f:
        json.dump({"samples": _digests(got), "error": error}, f)


@pytest.mark.parametrize("where", ["cache", "local"])
def test_a_file_cut_while_it_is_read_is_no_crash(server, files, tmp_path, where):
    """A disk hit cut short by someone else mid-read is evicted and fetched again; a local shard
    cut short is an error that says so. Neither kills the process."""
    ctx = multiprocessing.get_context("spawn")
    out = str(tmp_path / "out.json")
    if where == "cache":
        urls, cache_dir = [server.url(n) for n in NAMES], str(tmp_path / "cache")
        os.makedirs(cache_dir)
        expected = _expected(files)
        assert _read(urls, cache_dir)[0] == expected
        victim = os.path.join(cache_dir, cache_file_name(urls[0]))
    else:  # larger than the 8 MiB a local map is parsed at a time
        root = tmp_path / "local"
        root.mkdir()
        data = write_served(str(root), ["big.tar"], 40, 256 << 10)["big.tar"]
        urls, cache_dir, victim = [str(root / "big.tar")], None, str(root / "big.tar")
        assert len(data) > 9 << 20
    result = run_children([ctx.Process(target=_truncate_while_reading_in_child, args=(urls, cache_dir, victim, out))],
                          [out], 45)[0]
    if where == "cache":
        assert [tuple(s) for s in result["samples"]] == expected and result["error"] is None
        assert os.path.getsize(victim) == len(files[1][NAMES[0]])  # fetched whole again
    else:
        assert "shrank" in result["error"] and victim in result["error"]
        assert 1 <= len(result["samples"]) < 40
