"""One download per shard per node: processes that share `cache_dir` and start together, through
`WebDataset`, against the test HTTP server (which counts requests and bytes); one of them killed
in the middle of a shard it downloads for the others."""

from __future__ import annotations

import glob
import hashlib
import json
import multiprocessing
import os
import random
import signal
import threading
import time
import warnings

import pytest
from cachehooks import before_commits
from children import join_children, kill_alive, run_children
from looptools import wait_for
from shardsets import payload_digests, write_served

import shardstream as wds
from shardstream._cache.naming import cache_file_name

pytestmark = pytest.mark.timeout(120)
warnings.filterwarnings("ignore", message=".*shardshuffle.*")

SAMPLES, PAYLOAD = 12, 256 << 10  # about 3 MiB a shard: three full 1 MiB blocks and a short one
NAMES = [f"shard-{n}.tar" for n in range(4)]
PROCESSES = 4


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("served")
    return str(root), write_served(str(root), NAMES, SAMPLES, PAYLOAD)


def _digests(samples):
    return [list(d) for d in payload_digests(samples)]


def _expected(files, names=NAMES):
    return _digests(wds.WebDataset([os.path.join(files[0], n) for n in names], shardshuffle=False))


def _reader(urls, cache_dir, fetch, barrier, started_path, out_path):
    warnings.filterwarnings("ignore")
    if barrier is not None:
        barrier.wait(60)
    open(started_path, "w").close()
    it = iter(wds.WebDataset(urls, shardshuffle=False, cache_dir=cache_dir, fetch_options=wds.FetchOptions(**fetch)))
    samples = _digests(it)
    with open(out_path + ".part", "w") as f:
        json.dump({"samples": samples, "stats": it.stats().cache}, f)
    os.replace(out_path + ".part", out_path)


def _start(ctx, urls, cache_dir, fetch, barrier, tmp_path, tag):
    started, out = str(tmp_path / f"{tag}.started"), str(tmp_path / f"{tag}.json")
    proc = ctx.Process(target=_reader, args=(urls, cache_dir, fetch, barrier, started, out))
    proc.start()
    return proc, started, out


def _leftovers(cache_dir):
    return glob.glob(os.path.join(glob.escape(cache_dir), ".*.tmp"))


@pytest.mark.parametrize("parallel_parts", [1, 16], ids=["one-GET", "ranged-parts"])
def test_processes_started_together_download_each_shard_once(server, files, tmp_path, parallel_parts):
    urls = [server.url(n) for n in NAMES]
    cache_dir = str(tmp_path / "cache")
    os.makedirs(cache_dir)
    expected = _expected(files)
    # Slow enough that every process asks for every shard while it is still downloading.
    server.options.latency_ms = 30
    server.options.bandwidth = 8e6
    fetch = {"parallel_parts": parallel_parts, "part_size": 1 << 20}
    before = server.stats.snapshot()
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES)
    procs = [_start(ctx, urls, cache_dir, fetch, barrier, tmp_path, f"p{n}") for n in range(PROCESSES)]
    results = join_children([proc for proc, _, _ in procs], [out for _, _, out in procs], 90)
    for result in results:
        assert result["samples"] == expected  # every sample, in order, in every process
    after = server.stats.snapshot()
    sizes = {name: len(files[1][name]) for name in NAMES}
    # Each shard's bytes crossed the wire once between all the processes (not once per process) ...
    assert sum(sizes.values()) <= after.bytes_sent - before.bytes_sent < sum(sizes.values()) + (256 << 10)
    probes = {name: after.size_probes[name] - before.size_probes[name] for name in NAMES}
    assert all(n <= 1 for n in probes.values()), probes  # (at most one byte, for the size, by the one downloader)
    requests = {name: after.fetches[name] - before.fetches[name] for name in NAMES}  # (the probes aside)
    if parallel_parts == 1:  # ... in one GET per shard
        assert requests == dict.fromkeys(NAMES, 1)
    else:  # ... in the ranged parts of one download: at most one request per MiB
        assert all(1 <= requests[n] <= -(-sizes[n] // (1 << 20)) for n in NAMES), requests
    downloads = sum(r["stats"]["origin"]["fetches"] for r in results)
    followed = sum(r["stats"]["disk"]["followed"] for r in results)
    assert downloads == len(NAMES) and followed > 0, [r["stats"] for r in results]
    assert _leftovers(cache_dir) == []
    for name, url in zip(NAMES, urls):
        with open(os.path.join(cache_dir, cache_file_name(url)), "rb") as f:
            assert f.read() == files[1][name]


def test_a_writer_killed_mid_shard_is_taken_over(server, files, tmp_path):
    names = NAMES[:2]
    urls = [server.url(n) for n in names]
    cache_dir = str(tmp_path / "cache")
    os.makedirs(cache_dir)
    expected = _expected(files, names)
    server.options.latency_ms = 10
    server.options.bandwidth = 1e6  # ~3 s a shard on one connection: time to kill its writer in the middle
    fetch = {"parallel_parts": 1}
    before = server.stats.snapshot()
    ctx = multiprocessing.get_context("spawn")
    victim, _, _ = _start(ctx, urls, cache_dir, fetch, None, tmp_path, "victim")
    name0 = cache_file_name(urls[0])

    def victim_published_a_block():
        logs = glob.glob(os.path.join(glob.escape(cache_dir), glob.escape(f".{name0}") + f".*.{victim.pid}.*.sums.tmp"))
        return any(os.path.getsize(log) >= 16 + 8 for log in logs)  # header + one block's digest

    followers = []
    try:
        assert wait_for(victim_published_a_block, 60), "the victim wrote no block of the first shard"
        barrier = ctx.Barrier(2)
        followers = [_start(ctx, urls, cache_dir, fetch, barrier, tmp_path, f"f{n}") for n in range(2)]
        assert wait_for(lambda: all(os.path.exists(started) for _, started, _ in followers), 60), "followers not started"
        time.sleep(0.5)  # they are reading the victim's blocks now
        assert victim.is_alive()
        victim.kill()
        victim.join(10)
        assert victim.exitcode == -signal.SIGKILL
    except BaseException:
        kill_alive([victim] + [proc for proc, _, _ in followers])  # a failing test leaves no process behind
        raise
    results = join_children([proc for proc, _, _ in followers], [out for _, _, out in followers], 90)
    for result in results:
        assert result["samples"] == expected  # nothing partial, nothing repeated, in order
    assert sum(r["stats"]["disk"]["followed"] for r in results) >= 2
    # One download of each shard by the followers: the first one taken over from the victim, the
    # second one the victim had opened ahead (and never written: its reader was on the first).
    downloads = sum(r["stats"]["origin"]["fetches"] for r in results)
    assert downloads == 2, [r["stats"] for r in results]
    after = server.stats.snapshot()
    # (a one-byte size probe, `_fetch.parts`, aside)
    assert {n: after.fetches[n] - before.fetches[n] for n in names} == dict.fromkeys(names, 2)
    assert all(after.size_probes[n] - before.size_probes[n] <= 2 for n in names)  # at most one per download
    assert _leftovers(cache_dir) == []  # the victim's temp file and log were cleaned up
    for name, url in zip(names, urls):
        with open(os.path.join(cache_dir, cache_file_name(url)), "rb") as f:
            assert f.read() == files[1][name]


# --- two processes that read in different orders -----------------------------------------------


def _data(url: str) -> bytes:
    return random.Random(url).randbytes(3 << 20)


def _origin(url: str):
    data = _data(url)
    for i in range(0, len(data), 64 << 10):
        yield data[i : i + (64 << 10)]


def _crossed(cache_dir, ahead, first, barrier, out_path):
    from shardstream._cache.disk import DiskTier
    from shardstream._cache.shardcache import ShardCache

    cache = ShardCache([DiskTier(cache_dir, None, stall_timeout=60, lock_timeout=60)])
    assert cache.prepare(ahead)  # claimed ahead of reading, as a reader with shards in flight does
    barrier.wait(30)
    start = time.monotonic()
    got = {url: hashlib.sha256(b"".join(cache.stream(url, _origin))).hexdigest() for url in (first, ahead)}
    with open(out_path, "w") as f:
        json.dump({"digests": got, "seconds": time.monotonic() - start, "stats": cache.stats()}, f)


def test_processes_reading_in_crossed_orders_do_not_wait_on_each_others_claims(tmp_path):
    """A claimed W ahead and reads X first; B claimed X ahead and reads W first: each waits for a
    write the other has not begun. Each gives its unstarted claims back after a second, so both go
    on at once instead of waiting out the stall timeout (60 s here)."""
    cache_dir = str(tmp_path / "cache")
    os.makedirs(cache_dir)
    w, x = "http://h/w.tar", "http://h/x.tar"
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    outs = [str(tmp_path / "a.json"), str(tmp_path / "b.json")]
    procs = [ctx.Process(target=_crossed, args=(cache_dir, w, x, barrier, outs[0])),
             ctx.Process(target=_crossed, args=(cache_dir, x, w, barrier, outs[1]))]
    results = run_children(procs, outs, 90)
    expected = {u: hashlib.sha256(_data(u)).hexdigest() for u in (w, x)}
    assert all(r["digests"] == expected for r in results)
    assert all(r["seconds"] < 20 for r in results), [r["seconds"] for r in results]
    assert sum(r["stats"]["origin"]["fetches"] for r in results) == 2  # still one download per shard
    assert _leftovers(cache_dir) == []


def _stuck_writer(cache_dir, url, block_size):
    from shardstream._cache.disk import DiskTier
    from shardstream._cache.shardcache import ShardCache

    def origin(u):
        data = _data(u)
        yield data[: 2 * block_size]  # two blocks, then nothing: a holder whose reader stopped
        time.sleep(60)
        yield data[2 * block_size :]

    for _ in ShardCache([DiskTier(cache_dir, None, chunk_size=block_size)]).stream(url, origin):
        pass


def _read_within(cache_dir, url, block, stall_timeout, seconds):
    """Read `url` through a fresh disk cache in `cache_dir` within `seconds`, fetching it from the
    origin once; return the cache."""
    from shardstream._cache.disk import DiskTier
    from shardstream._cache.shardcache import ShardCache

    cache = ShardCache([DiskTier(cache_dir, None, chunk_size=block, stall_timeout=stall_timeout)])
    fetched = []

    def origin(u):
        fetched.append(u)
        return _origin(u)

    start = time.monotonic()
    assert b"".join(cache.stream(url, origin)) == _data(url)
    assert time.monotonic() - start < seconds and fetched == [url]
    return cache


def test_a_follower_of_a_stalled_write_reads_on_from_the_origin(tmp_path):

    cache_dir, url, block = str(tmp_path / "cache"), "http://h/s.tar", 1 << 20
    os.makedirs(cache_dir)
    holder = multiprocessing.get_context("fork").Process(target=_stuck_writer, args=(cache_dir, url, block))
    holder.start()
    try:
        assert wait_for(lambda: any(os.path.getsize(p) >= 16 + 2 * 8 for p in glob.glob(f"{cache_dir}/.*.sums.tmp")),
                        60), "the holder published no two blocks"
        cache = _read_within(cache_dir, url, block, 1.0, seconds=10)  # two blocks followed, the rest fetched
        disk = cache.stats()["disk"]
        assert disk["followed"] == 1 and disk["bypassed"] == 1 and disk["bytes_served"] == 2 * block
        assert not os.path.exists(cache.tiers[0].path_for(url))  # the holder's claim stays its own
    finally:
        holder.kill()
        holder.join(10)


def _giving_up_writer(cache_dir, url, block_size, marker):
    from shardstream._cache.disk import DiskTier
    from shardstream._cache.shardcache import ShardCache

    def origin(u):
        data = _data(u)
        yield data[: 2 * block_size]  # past its tier's bound: it gives up caching the shard
        open(marker, "w").close()
        time.sleep(60)  # and its reader stops (holding on to the stream)
        yield data[2 * block_size :]

    tier = DiskTier(cache_dir, block_size + block_size // 2, chunk_size=block_size)
    for _ in ShardCache([tier]).stream(url, origin):
        pass


def test_a_writer_that_gives_up_lets_a_follower_take_the_shard_at_once(tmp_path):
    """A process that stops caching a shard (too big for its bound, a failed write) lets its claim
    go at once: a process that wants the shard meanwhile takes the claim and caches it itself,
    instead of waiting for a write that will never come until its stall timeout."""

    cache_dir, url, block = str(tmp_path / "cache"), "http://h/s.tar", 1 << 20
    marker = str(tmp_path / "gave-up")
    os.makedirs(cache_dir)
    holder = multiprocessing.get_context("fork").Process(target=_giving_up_writer,
                                                         args=(cache_dir, url, block, marker))
    holder.start()
    try:
        assert wait_for(lambda: os.path.exists(marker), 60), "the holder never got past its bound"
        cache = _read_within(cache_dir, url, block, 60.0, seconds=10)
        cache.settle()
        assert open(cache.tiers[0].path_for(url), "rb").read() == _data(url)  # cached by the follower
    finally:
        holder.kill()
        holder.join(10)


def test_the_reader_goes_on_while_a_shard_is_committed(server, files, tmp_path, monkeypatch):
    """A commit (the last block's write, the sidecar, the rename) runs on the writer thread: with
    shard 0's commit held up, the reader already hands out shard 1's samples; the pass ends with
    every shard committed, and the claim is let go only after the file is in place."""
    urls = [server.url(n) for n in NAMES]
    cache_dir = str(tmp_path / "cache")
    os.makedirs(cache_dir)
    held, committing = threading.Event(), threading.Event()
    seen_while_held, claim_free_while_held = [], []

    def hold_shard_0(tier, url):
        if url == urls[0]:
            committing.set()
            held.wait(10)  # until the reader reaches shard 2 (10 s where the reader waits for us)
            claim_free_while_held.append(not tier.writing_here(url))
            committing.clear()

    before_commits(monkeypatch, hold_shard_0)
    samples = []
    for sample in wds.WebDataset(urls, shardshuffle=False, cache_dir=cache_dir):
        samples.append(sample)
        shard = int(sample["__url__"].rsplit("-", 1)[1].split(".")[0])
        if shard >= 1 and not held.is_set():
            committing.wait(5)  # (the writer thread may not have reached shard 0's commit yet, on a busy machine)
        if committing.is_set() and shard >= 1:
            seen_while_held.append(shard)
            if shard == 2:
                held.set()
    assert 1 in seen_while_held and 2 in seen_while_held  # read on while shard 0 was being committed
    assert claim_free_while_held == [False]  # the claim is held until the file is in place
    assert payload_digests(samples) == [tuple(d) for d in _expected(files)]
    committed = sorted(n for n in os.listdir(cache_dir) if not n.startswith("."))
    assert committed == sorted(cache_file_name(u) for u in urls) and _leftovers(cache_dir) == []


def test_pass_stats_count_the_commits_of_a_pass_cut_short(server, files, tmp_path, monkeypatch):
    """`with_epoch` ends a pass mid-shard: the stats of that pass are taken after the cache's
    commits of the shards read whole, not while they are still on the writer thread."""
    before_commits(monkeypatch, lambda tier, url: time.sleep(0.3))
    cache_dir = str(tmp_path / "cache")
    os.makedirs(cache_dir)
    ds = wds.WebDataset([server.url(n) for n in NAMES], shardshuffle=False, cache_dir=cache_dir).with_epoch(
        SAMPLES + SAMPLES // 2)  # shard 0 whole, half of shard 1
    assert sum(1 for _ in ds) == SAMPLES + SAMPLES // 2
    written = ds.stats().cache["disk"]["bytes_written"]  # (the reader may have run ahead into shard 2)
    committed = [n for n in NAMES if os.path.exists(os.path.join(cache_dir, cache_file_name(server.url(n))))]
    assert NAMES[0] in committed and written == sum(len(files[1][n]) for n in committed)
