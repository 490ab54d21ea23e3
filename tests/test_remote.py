"""Remote shards end to end: WebDataset over a real local HTTP server, with and without the
shard cache; the same samples as from local files."""

from __future__ import annotations

import os
import sys
import warnings

import pytest

import shardstream as wds

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "tools"))
from shardserver import ShardServer  # noqa: E402
from needs import needs_torch

warnings.filterwarnings("ignore", message=".*shardshuffle.*")


def _keys(samples):
    return [(s["__key__"], sorted(k for k in s if not k.startswith("__"))) for s in samples]


@pytest.fixture()
def served(shardset):
    root = os.path.dirname(shardset[0])
    with ShardServer(root, latency_ms=5) as server:
        yield server, [server.url(os.path.basename(p)) for p in shardset]


@pytest.mark.timeout(60)
def test_http_gives_the_same_samples_as_local_files(served, shardset):
    _server, urls = served
    local = list(wds.WebDataset(shardset, shardshuffle=False))
    remote = list(wds.WebDataset(urls, shardshuffle=False))
    assert _keys(remote) == _keys(local)
    assert [s.get("jpg") for s in remote] == [s.get("jpg") for s in local]
    assert all(s["__url__"].startswith("http://") and "__local_path__" not in s for s in remote)


def _ipv6_loopback() -> bool:
    import socket

    try:
        socket.create_server(("::1", 0), family=socket.AF_INET6).close()
        return True
    except OSError:
        return False


@pytest.mark.timeout(60)
@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback on this machine")
def test_a_string_spec_of_ipv6_hosts_is_split_between_sources_only(shardset):
    """`http://[::1]:port/a.tar` in a string spec: the `::` of the host cut it into `http://[`,
    `1]:port/a.tar` (as webdataset does), a bare ValueError naming no URL."""
    root = os.path.dirname(shardset[0])
    names = [os.path.basename(p) for p in shardset]
    with ShardServer(root, host="::1") as server:
        assert server.url(names[0]).startswith("http://[::1]:")
        spec = f"{server.url(names[0])}::{server.url(names[1])}"
        assert wds.shardlists.expand_urls(spec) == [server.url(names[0]), server.url(names[1])]
        remote = list(wds.WebDataset(spec, shardshuffle=False))
    assert _keys(remote) == _keys(wds.WebDataset(shardset[:2], shardshuffle=False))


@pytest.mark.timeout(60)
def test_disk_cache_streams_through_then_serves_hits(served, shardset, tmp_path):
    server, urls = served
    ds = wds.WebDataset(urls, shardshuffle=False, cache_dir=str(tmp_path))
    it = iter(ds)
    first = list(it)
    stats = it.stats()
    assert stats.cache["disk"]["misses"] == len(urls)
    files = [f for f in os.listdir(tmp_path) if f.endswith(".tar") or f.endswith(".tar.gz")]
    assert len(files) == len(urls)
    requests = server.stats.snapshot().requests
    it = iter(ds)
    second = list(it)
    assert _keys(second) == _keys(first)
    assert it.stats().cache["disk"]["hits"] == len(urls)
    assert server.stats.snapshot().requests == requests  # nothing fetched again
    assert "cache disk:" in it.stats().format()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("handler", ["reraise_exception", "warn_and_continue"])
def test_a_cache_folder_that_cannot_take_a_lock_streams_its_misses_uncached(served, shardset, tmp_path, caplog,
                                                                           handler):
    """A claim's lock file that cannot be made (a cache disk out of inodes, or mounted read-only
    after it was filled: here the lock file's path is a folder, EISDIR) costs the miss its
    caching, not the epoch: hits are served, misses stream uncached, and it is said once."""
    server, urls = served
    cache = tmp_path / "cache"
    cache.mkdir()
    ds = wds.WebDataset(urls, shardshuffle=False, cache_dir=str(cache), handler=getattr(wds, handler))
    first = list(ds)
    missing = [name for name in os.listdir(cache) if not name.startswith(".")][-2:]
    for name in missing:  # the next pass misses these, and cannot lock them
        os.unlink(cache / name)
        os.unlink(cache / ".locks" / name)
        os.mkdir(cache / ".locks" / name)
    caplog.set_level("WARNING", logger="shardstream")
    it = iter(ds)
    second = list(it)
    assert _keys(second) == _keys(first)
    assert it.stats().cache["disk"]["hits"] == len(urls) - 2
    warned = [r.getMessage() for r in caplog.records if "cannot lock" in r.getMessage()]
    assert len(warned) == 1 and f"in the cache folder {cache} (Is a directory)" in warned[0]  # (once)
    assert sorted(n for n in os.listdir(cache) if not n.startswith(".")) == sorted(
        n for n in os.listdir(cache) if not n.startswith(".") and n not in missing)


@pytest.mark.timeout(60)
def test_a_transfer_that_breaks_inside_a_member_names_the_member(tmp_path):
    """A fetch error part-way through a shard says inside which member it broke, as a format
    error does (the offset stays the byte where the transfer broke)."""
    import tarfile

    from shardsets import write_tar

    path = write_tar(str(tmp_path / "big.tar"), [(f"s{i}.bin", bytes([i]) * 102400) for i in range(10)])
    with tarfile.open(path) as tar:
        spans = {m.name: (m.offset, m.offset_data + m.size) for m in tar.getmembers()}
    options = wds.FetchOptions(retries=0, parallel_parts=1)
    with ShardServer(str(tmp_path), reset_rate=1.0, cut_fraction=0.37) as server:
        with pytest.raises(wds.FetchError) as caught:
            list(wds.WebDataset(server.url("big.tar"), shardshuffle=False, fetch_options=options))
    error = caught.value
    start, end = spans[error.member]
    assert start < error.offset < end and f"member={error.member!r}" in str(error)


def test_a_cache_folder_whose_lock_folder_cannot_be_made_is_a_usage_error(tmp_path):
    """(A read-only cache folder that shardstream never wrote, say.)"""
    (tmp_path / ".locks").write_text("not a folder")
    with pytest.raises(wds.UsageError, match="cannot be used") as info:
        wds.WebDataset("http://127.0.0.1:9/a.tar", shardshuffle=False, cache_dir=str(tmp_path))
    assert str(tmp_path) in str(info.value)


@pytest.mark.timeout(60)
def test_cached_remote_samples_name_their_cache_file_like_webdataset(served, shardset, tmp_path):
    import webdataset

    _server, urls = served
    (tmp_path / "theirs").mkdir()  # neither library creates it
    (tmp_path / "ours").mkdir()
    theirs = list(webdataset.WebDataset(urls[:2], shardshuffle=False, cache_dir=str(tmp_path / "theirs")))
    ds = wds.WebDataset(urls[:2], shardshuffle=False, cache_dir=str(tmp_path / "ours"))
    for _ in range(2):  # the first pass streams through the cache, the second reads hits
        ours = list(ds)
        assert [s["__key__"] for s in ours] == [s["__key__"] for s in theirs]
        for a, b in zip(ours, theirs):
            assert a["__local_path__"].startswith(str(tmp_path / "ours"))
            assert b["__local_path__"].startswith(str(tmp_path / "theirs"))
        # our file names differ (a digest of the whole URL: README divergence); the bytes do not
        for url, path in {s["__url__"]: s["__local_path__"] for s in ours}.items():
            theirs_path = {s["__url__"]: s["__local_path__"] for s in theirs}[url]
            assert open(path, "rb").read() == open(theirs_path, "rb").read()


@pytest.mark.timeout(120)
def test_three_epochs_under_faults_deliver_every_sample_exactly_once(served, shardset):
    server, urls = served
    expected = sorted(s["__key__"] + s["__url__"][-8:] for s in wds.WebDataset(urls, shardshuffle=False))
    server.options.seed = 7
    server.options.status_rate = 0.05
    server.options.reset_rate = 0.05
    fast_retries = wds.FetchOptions(backoff_base=0.01, backoff_max=0.05)
    ds = wds.WebDataset(urls, shardshuffle=False, fetch_options=fast_retries).with_engine(threads=2)
    for epoch in range(3):
        got = sorted(s["__key__"] + s["__url__"][-8:] for s in ds)
        assert got == expected, f"epoch {epoch}"
    faults = server.stats.snapshot().faults
    assert faults.get("status", 0) + faults.get("reset", 0) > 0


@pytest.mark.timeout(120)
def test_stats_count_the_retries_and_resumes_of_this_pipeline(served, shardset):
    server, urls = served
    server.options.seed = 7
    server.options.status_rate = 0.2
    server.options.reset_rate = 0.2
    fast_retries = wds.FetchOptions(backoff_base=0.01, backoff_max=0.05)
    it = iter(wds.WebDataset(urls, shardshuffle=False, fetch_options=fast_retries))
    assert len(list(it)) == len(list(wds.WebDataset(shardset, shardshuffle=False)))
    source = it.stats().source
    faults = server.stats.snapshot().faults
    # every retry answers an injected fault (size probes outside the streams may take a few)
    assert 0 < source["retries"] <= faults.get("status", 0) + faults.get("reset", 0)
    assert 0 < source["resumes"] <= source["retries"] and source["errors"] == 0
    retries, resumes = source["retries"], source["resumes"]
    assert (f"{retries:,} {'retry' if retries == 1 else 'retries'}, "
            f"{resumes:,} {'resume' if resumes == 1 else 'resumes'}, 0 errors") in it.stats().format()
    # counted per pipeline: a clean pass in the same process starts from zero
    server.options.status_rate = server.options.reset_rate = 0.0
    it = iter(wds.WebDataset(urls, shardshuffle=False, fetch_options=fast_retries))
    list(it)
    assert it.stats().source["retries"] == it.stats().source["resumes"] == 0
    assert "0 retries, 0 resumes, 0 errors" in it.stats().format()


_WARM_SCRIPT = """
import json, sys, time
import shardstream as wds
mode, urls, local = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
assert "aiohttp" not in sys.modules
if mode in ("warm", "warm-pipeline"):
    wds.WebDataset(local, shardshuffle=False)
    time.sleep(0.5)
    local_only = "aiohttp" not in sys.modules
    if mode == "warm":
        wds.WebDataset(urls, shardshuffle=False)  # not iterated
    else:  # OpenCLIP's style: a shard list in a function-style pipeline
        wds.DataPipeline(wds.SimpleShardList(urls), wds.tarfile_to_samples())
    deadline = time.monotonic() + 30
    while "aiohttp.client" not in sys.modules and time.monotonic() < deadline:
        time.sleep(0.01)
    print(json.dumps({"local_only": local_only, "warmed": "aiohttp.client" in sys.modules}))
elif mode == "cached":  # a pass with a cache directory: does it import the HTTP client?
    n = sum(1 for _ in wds.WebDataset(urls, shardshuffle=False, cache_dir=sys.argv[4]))
    print(json.dumps({"samples": n, "client": "aiohttp" in sys.modules}))
else:  # workers forked at once, while the import may still be running
    loader = wds.WebLoader(wds.WebDataset(urls, shardshuffle=False), batch_size=None, num_workers=2)
    print(json.dumps({"samples": sum(1 for _ in loader)}))
"""


def _warm_script(mode, urls, local, *extra):
    import json
    import subprocess

    done = subprocess.run([sys.executable, "-c", _WARM_SCRIPT, mode, json.dumps(urls), json.dumps(local), *extra],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(300)
@needs_torch
def test_a_remote_dataset_imports_its_fetcher_when_built_and_forks_safely(served, shardset):
    """Built over http URLs, a WebDataset (or a function-style pipeline's shard list) starts
    importing the fetcher (aiohttp) in the background, so that the first fetch does not import it
    on the event loop's thread (over local files it imports nothing). DataLoader workers forked
    while that import may still run wait for it and read every sample."""
    _server, urls = served
    local = list(shardset)
    assert _warm_script("warm", urls, local) == {"local_only": True, "warmed": True}
    assert _warm_script("warm-pipeline", urls, local) == {"local_only": True, "warmed": True}
    expected = len(list(wds.WebDataset(shardset, shardshuffle=False)))
    for _ in range(3):
        assert _warm_script("fork", urls, local) == {"samples": expected}


@pytest.mark.timeout(300)
def test_a_pass_that_finds_every_shard_cached_never_imports_the_http_client(served, shardset, tmp_path):
    """A fresh process whose shards are all in the cache reads them without aiohttp (its import is
    0.15-0.27 s of CPU on the cores the pass uses) and without a request; one shard missing, and
    the client is imported and that shard fetched."""
    server, urls = served
    expected = len(list(wds.WebDataset(shardset, shardshuffle=False)))
    full, partial = tmp_path / "full", tmp_path / "partial"
    full.mkdir(), partial.mkdir()
    assert _warm_script("cached", urls, [], str(full)) == {"samples": expected, "client": True}
    _warm_script("cached", urls[1:], [], str(partial))
    requests = server.stats.snapshot().requests
    assert _warm_script("cached", urls, [], str(full)) == {"samples": expected, "client": False}
    assert server.stats.snapshot().requests == requests
    first = os.path.basename(shardset[0])
    before = server.stats.snapshot().path_requests
    assert _warm_script("cached", urls, [], str(partial)) == {"samples": expected, "client": True}
    after = server.stats.snapshot().path_requests
    assert after[first] > before[first] and sum(after.values()) - sum(before.values()) == after[first] - before[first]


def _failing_dataset(server, urls, **kw):
    options = wds.FetchOptions(retries=2, backoff_base=0.01, backoff_max=0.02)
    return wds.WebDataset(urls, shardshuffle=False, fetch_options=options, **kw)


@pytest.mark.timeout(60)
def test_a_shard_that_keeps_failing_is_a_clear_error_with_credentials_redacted(served):
    server, urls = served
    bad = urls[1].replace("http://", "http://user:hunter2@")
    server.options.fail_first = {bad.rsplit("/", 1)[1]: 1000}
    with pytest.raises(wds.FetchError) as info:
        list(_failing_dataset(server, [urls[0], bad, urls[2]]))
    message = str(info.value)
    assert "hunter2" not in message and "***@" in message and bad.rsplit("/", 1)[1] in message


@pytest.mark.timeout(60)
def test_warn_and_continue_skips_a_failing_shard(served, shardset):
    server, urls = served
    server.options.fail_first = {urls[1].rsplit("/", 1)[1]: 1000}
    ds = _failing_dataset(server, urls[:3], handler=wds.warn_and_continue)
    with pytest.warns(UserWarning):
        got = list(ds)
    expected = [s["__key__"] for u in (shardset[0], shardset[2]) for s in wds.WebDataset(u, shardshuffle=False)]
    assert [s["__key__"] for s in got] == expected


@pytest.mark.timeout(60)
def test_missing_remote_shard_is_not_found(served):
    server, urls = served
    with pytest.raises(wds.ShardNotFound):
        list(wds.WebDataset([urls[0].replace("shard-000", "nothere")], shardshuffle=False))


@pytest.mark.timeout(60)
def test_openclip_style_url_opener_over_http_survives_resets(served, shardset):
    server, urls = served
    server.options.seed = 3
    server.options.reset_rate = 0.3
    from shardstream.tariterators import tar_file_expander, url_opener

    files = list(tar_file_expander(url_opener([dict(url=u) for u in urls])))
    expected = list(wds.tariterators.tar_file_expander(wds.tariterators.url_opener([dict(url=p) for p in shardset])))
    assert [(f["fname"], f["data"]) for f in files] == [(f["fname"], f["data"]) for f in expected]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("handler", ["reraise_exception", "warn_and_continue"])
def test_closing_a_pass_does_not_wait_for_a_silent_transfer(tmp_path, handler):
    """A `break` (or Ctrl-C) while the reader waits for a stalled server: the reader's thread
    waited on the stream's buffer, deaf to the engine's stop, and closing the pass waited out its
    5 s join; now the wait sees the stop. Under a continuing handler the stop is not taken for a
    shard's error (no warning, no next shard)."""
    import threading
    import time

    from shardsets import write_tar

    write_tar(str(tmp_path / "a.tar"), [("s0.txt", b"x"), ("s1.txt", b"y"), ("s2.bin", bytes(1 << 20))])
    with ShardServer(str(tmp_path)) as server:
        server.options.stall_rate, server.options.stall_seconds, server.options.cut_fraction = 1.0, 20.0, 0.3
        dataset = wds.WebDataset(server.url("a.tar"), shardshuffle=False, handler=getattr(wds, handler),
                                 fetch_options=wds.FetchOptions(stall_timeout=60, parallel_parts=1))
        it = iter(dataset)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # (a warning from the handler would fail here)
            assert next(it)["__key__"] == "s0"
            time.sleep(0.5)  # the reader is waiting for s2's bytes, in the stall
            start = time.monotonic()
            it.close()
            took = time.monotonic() - start
        assert took < 2.0, took
        assert not [t for t in threading.enumerate() if t.name.startswith("shardstream-SimpleShardList")]


@pytest.mark.timeout(60)
def _same(sample):
    return sample


@pytest.mark.timeout(60)
def test_an_iterator_collected_on_the_event_loop_thread_does_not_stall_it(tmp_path):
    """An HTTP iterator abandoned in a reference cycle, collected by a gc pass that ran on the
    fetchers' loop thread (aiohttp allocates there): its close joined a reader thread that waits
    on that loop, freezing every transfer of the process for the join's 5 s timeout."""
    import asyncio
    import gc
    import time

    from shardstream._fetch.loop import get_loop

    from shardserver import start_subprocess, stop_subprocess

    for shard in range(4):
        with wds.TarWriter(str(tmp_path / f"s-{shard}.tar")) as sink:
            for i in range(50):
                sink.write({"__key__": f"k{shard}_{i:03d}", "txt": f"caption {i}", "bin": os.urandom(4000)})
    proc, base = start_subprocess(tmp_path, latency_ms=20, bandwidth=200e3)  # (its own process: not on our loop)
    try:
        urls = [f"{base}/s-{shard}.tar" for shard in range(4)]
        gc.disable()
        try:
            it = iter(wds.WebDataset(urls, shardshuffle=False).map(_same).batched(4))
            next(it)
            cycle = {"it": it}
            cycle["self"] = cycle
            del it, cycle
            loop = get_loop()
            loop.call_soon_threadsafe(gc.collect)
            time.sleep(0.1)
            started = time.monotonic()
            asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(30)
            assert time.monotonic() - started < 1.0
        finally:
            gc.enable()
    finally:
        stop_subprocess(proc)


def test_the_verdict_blames_storage_when_the_reader_waits_for_bytes(shardset):
    """A pass over a slow server spends most of its time waiting for bytes that have not arrived:
    the stats count that wait, and the verdict names the storage, not the reader's CPU. Local files
    never wait."""
    root = os.path.dirname(shardset[0])
    with ShardServer(root, latency_ms=50, bandwidth=2e6) as server:
        urls = [server.url(os.path.basename(p)) for p in shardset]
        # one shard at a time and no ranged parts: the pass is bound to one slow connection
        it = iter(wds.WebDataset(urls[:2], shardshuffle=False, shards_in_flight=1,
                                 fetch_options=wds.FetchOptions(parallel_parts=1)))
        assert len(list(it)) > 0
    stats = it.stats()
    waited = stats.source["wait_us"] / 1e6
    assert 0.5 * stats.wall_s < waited <= stats.wall_s
    assert "storage or the network limits this pass" in stats.verdict()
    assert f"waited {waited:.2f}s for bytes" in stats.format()
    it = iter(wds.WebDataset(shardset[:2], shardshuffle=False))
    list(it)
    # (every field is there, as documented: local shards wait for nothing)
    assert it.stats().source["wait_us"] == 0 and "storage" not in it.stats().verdict()
