"""One URL fetched over several connections at once (FetchOptions.parallel_parts): ranged
http_stream, exact bytes around part boundaries, speed under a per-connection
bandwidth cap, faults, errors in order, close, and the fall-back to one connection."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest
from aiohttp import web
from looptools import loop_tasks, reader, serve_app, wait_for, write_files

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))

from shardserver import ShardServer  # noqa: E402

from shardstream._base.errors import FetchError, ShardNotFound  # noqa: E402
from shardstream._fetch.stream import open_stream  # noqa: E402
from shardstream._fetch.registry import fetch_stream
from shardstream._fetch.options import FetchOptions
from shardstream._fetch.http import http_stream  # noqa: E402
from shardstream._fetch.loop import run_coroutine  # noqa: E402

pytestmark = pytest.mark.timeout(20)

KIB, MIB = 1 << 10, 1 << 20
PART = 64 * KIB
FAST = FetchOptions(
    backoff_base=0.01, backoff_max=0.05, chunk_size=16 * KIB, prefetch_bytes=256 * KIB, stall_timeout=5,
    part_size=PART,
)
SIZES = {
    "empty.bin": 0, "one.bin": 1, "below.bin": PART - 1, "exact.bin": PART, "above.bin": PART + 1,
    "several.bin": 3 * PART + 5, "four.bin": 4 * MIB, "large.bin": 8 * MIB,
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_files(tmp_path_factory.mktemp("served"), SIZES, seed=100)


@pytest.fixture(scope="module")
def shared_server(files):
    with ShardServer(files[0]) as srv:
        yield srv


fetch_all = reader(FAST)  # the `server` fixture comes from conftest.py


async def _collect(chunks):
    return b"".join([chunk async for chunk in chunks])


def collect(chunks, timeout=10):
    return run_coroutine(_collect(chunks)).result(timeout)


# --- http_stream(start, stop) -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["empty.bin", "one.bin", "above.bin", "several.bin"])
def test_ranged_http_stream(shared_server, files, name):
    data, url = files[1][name], shared_server.url(name)
    n = len(data)
    cases = {(0, None), (0, 0), (0, 1), (0, n), (0, n + 10), (n // 2, n), (n // 3, n // 2), (n, n + 5)}
    cases |= {(PART - 1, PART + 1), (PART, 2 * PART), (1, PART)}
    for start, stop in sorted(cases, key=str):
        if start > n:
            continue
        if stop is not None and stop < start:
            continue
        expected = data[start:stop]
        got = collect(http_stream(url, options=FAST, start=start, stop=stop))
        assert got == expected, (start, stop)


def test_ranged_http_stream_rejects_a_bad_range(shared_server):
    with pytest.raises(ValueError):
        collect(http_stream(shared_server.url("one.bin"), options=FAST, start=5, stop=2))


def test_ranged_resume_after_faults(server, files):
    server.options.seed, server.options.reset_rate, server.options.truncate_rate = 5, 0.3, 0.2
    data, url = files[1]["large.bin"], server.url("large.bin")
    ranges = [(0, MIB), (MIB + 7, 3 * MIB), (len(data) - MIB, len(data))]
    ranges += [(i * 700_001, i * 700_001 + 300_000) for i in range(10)]
    for start, stop in ranges:
        assert collect(http_stream(url, options=FAST, start=start, stop=stop)) == data[start:stop]
    seen = server.stats.snapshot()
    assert sum(seen.faults.values()) > 0 and seen.requests > len(ranges)


# --- exact bytes ------------------------------------------------------------------------------------


@pytest.mark.parametrize("parts", [1, 2, 3, 4])
@pytest.mark.parametrize("name", ["empty.bin", "one.bin", "below.bin", "exact.bin", "above.bin", "several.bin"])
def test_exact_bytes_around_part_boundaries(shared_server, files, name, parts):
    data, url = files[1][name], shared_server.url(name)
    options = FAST.replace(parallel_parts=parts)
    before = shared_server.stats.snapshot().requests
    got, stats = fetch_all(url, options)
    assert got == data and stats["bytes"] == len(data) and stats["retries"] == 0
    requests = shared_server.stats.snapshot().requests - before
    # one request per part; the first part's Content-Range tells the size (no extra request)
    assert requests == (1 if parts == 1 else max(1, -(-len(data) // PART)))
    for start in {1, PART - 1, PART, PART + 1, len(data) // 2}:
        if start <= len(data):
            got = collect(fetch_stream(url, options=options, start=start))
            assert got == data[start:], start


def test_a_server_without_validators_is_read_over_one_connection_with_a_warning(server, files, caplog):
    """No ETag, no Last-Modified: nothing could show that the parts of a shard come from one
    version of it (an object replaced meanwhile would be spliced from two of the same size), so
    the download is not cut into parts; said once per server."""
    import logging

    import shardstream._fetch.http as http

    server.options.no_validators = True
    http._told_no_validator.clear()
    options = FAST.replace(parallel_parts=8)
    with caplog.at_level(logging.WARNING, logger="shardstream"):
        for name in ("large.bin", "four.bin"):
            before = server.stats.snapshot()
            got, _stats = fetch_all(server.url(name), options)
            assert got == files[1][name]
            after = server.stats.snapshot()
            # the first part's request (which tells there is no validator), then one for the rest
            assert after.requests - before.requests == 2 and after.range_requests - before.range_requests <= 2
    said = [r.getMessage() for r in caplog.records if "gives no ETag or Last-Modified" in r.getMessage()]
    assert len(said) == 1 and server.url("")[:-1].rstrip("/") in said[0]
    server.options.no_validators = False
    before = server.stats.snapshot().requests
    assert fetch_all(server.url("large.bin"), options)[0] == files[1]["large.bin"]
    assert server.stats.snapshot().requests - before == 8 * MIB // PART  # in parts again


def test_many_parts_with_small_chunks(shared_server, files):
    data = files[1]["large.bin"]
    options = FAST.replace(parallel_parts=8, part_size=100_000, chunk_size=7_000)
    got, stats = fetch_all(shared_server.url("large.bin"), options)
    assert got == data and stats["bytes"] == len(data)


# --- speed ------------------------------------------------------------------------------------------


def test_parallel_parts_beat_the_per_connection_cap(server, files):
    server.options.latency_ms, server.options.bandwidth = 20, 2e6
    data, url = files[1]["four.bin"], server.url("four.bin")
    timings = {}
    for parts in (1, 4):
        options = FAST.replace(parallel_parts=parts, part_size=512 * KIB, chunk_size=64 * KIB, prefetch_bytes=1 * MIB)
        started = time.monotonic()
        got, _ = fetch_all(url, options)
        timings[parts] = time.monotonic() - started
        assert got == data
    assert timings[1] >= len(data) / 2e6 * 0.9
    assert timings[4] < 0.6 * timings[1], timings


# --- faults and errors ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["reset", "status", "truncate", "wrong_length", "throttle"])
def test_faults_still_give_exact_bytes(server, files, kind):
    server.options.seed = 11
    setattr(server.options, f"{kind}_rate", 0.25)
    if kind == "throttle":
        server.options.retry_after = 0
    options = FAST.replace(parallel_parts=4)
    total_retries = 0
    for name in ["several.bin", "large.bin", "above.bin"]:
        got, stats = fetch_all(server.url(name), options)
        assert got == files[1][name], name
        assert stats["bytes"] == len(got)
        total_retries += stats["retries"]
    seen = server.stats.snapshot()
    assert seen.faults[kind] > 0
    # A fault in the body of a size probe costs nothing (the size came with the headers), and a
    # wrong Content-Length is overruled by the Content-Range of a part: no retry for those.
    if kind != "wrong_length":
        assert total_retries > 0 and total_retries >= seen.faults[kind] - 3


def test_not_found_with_parallel_parts(server):
    with pytest.raises(ShardNotFound):
        fetch_all(server.url("missing.bin"), FAST.replace(parallel_parts=4))


def _serve_ranges(data, refuse_from=None, ignore_range=False, seen=None, hide_size=False):
    async def handle(request):
        header = request.headers.get("Range")
        if seen is not None:
            seen.append(header)
        if ignore_range or header is None:
            return web.Response(body=data, headers={"ETag": '"v1"'})
        first, _, last = header.removeprefix("bytes=").partition("-")
        first, last = int(first), min(int(last) if last else len(data) - 1, len(data) - 1)
        if refuse_from is not None and first >= refuse_from:
            return web.Response(status=403, text="no")
        size = "*" if hide_size else len(data)
        headers = {"ETag": '"v1"', "Content-Range": f"bytes {first}-{last}/{size}"}
        return web.Response(status=206, body=data[first : last + 1], headers=headers)

    return serve_app(handle)


def test_a_failing_part_surfaces_in_order(files):
    data = files[1]["large.bin"]
    runner, url = _serve_ranges(data, refuse_from=3 * PART)
    try:
        got = bytearray()
        with open_stream(url, options=FAST.replace(parallel_parts=4)) as stream:
            with pytest.raises(FetchError, match="403"):
                for chunk in stream:
                    got += chunk
        assert bytes(got) == data[: 3 * PART]  # every byte before the failed part, in order
    finally:
        run_coroutine(runner.cleanup()).result(5)


def test_a_server_without_range_support_gets_one_connection(files):
    data, seen = files[1]["several.bin"], []
    runner, url = _serve_ranges(data, ignore_range=True, seen=seen)
    try:
        got, _ = fetch_all(url, FAST.replace(parallel_parts=4))
        # The first part's request (answered 200: no ranges), then one plain GET for all of it.
        assert got == data and seen == [f"bytes=0-{PART - 1}", None]
        got = collect(fetch_stream(url, options=FAST.replace(parallel_parts=4), start=PART + 3))
        assert got == data[PART + 3 :]
        # A ranged http_stream cuts a 200's body at `stop`.
        assert collect(http_stream(url, options=FAST, start=10, stop=PART + 20)) == data[10 : PART + 20]
    finally:
        run_coroutine(runner.cleanup()).result(5)


def test_unknown_size_falls_back_to_one_connection(files):
    data, seen = files[1]["large.bin"], []
    runner, url = _serve_ranges(data, hide_size=True, seen=seen)  # Content-Range: bytes a-b/*
    try:
        got, _ = fetch_all(url, FAST.replace(parallel_parts=4))
        # The first part's request told no size: one plain GET reads it all.
        assert got == data and seen == [f"bytes=0-{PART - 1}", None]
    finally:
        run_coroutine(runner.cleanup()).result(5)


# --- close, memory --------------------------------------------------------------------------------


def test_close_mid_download_cancels_every_part(server, files):
    # warm: loop, session, pooled connections, the loop's executor threads (DNS lookups)
    fetch_all(server.url("several.bin"), FAST.replace(parallel_parts=4))
    baseline_tasks, baseline_threads = loop_tasks(), set(threading.enumerate())
    server.options.bandwidth = 2e6
    options = FAST.replace(parallel_parts=4, part_size=1 * MIB)
    stream = open_stream(server.url("large.bin"), options=options)
    assert files[1]["large.bin"].startswith(next(stream))
    assert wait_for(lambda: server.stats.bytes_sent > 512 * KIB)
    assert len(loop_tasks()) >= len(baseline_tasks) + 5  # the pump and four parts
    started = time.monotonic()
    stream.close()
    assert time.monotonic() - started < 0.5
    assert wait_for(lambda: loop_tasks() == baseline_tasks)
    sent = server.stats.bytes_sent
    time.sleep(0.3)  # four live connections at 2 MB/s would send ~2.4 MB more
    assert server.stats.bytes_sent - sent < 256 * KIB
    assert set(threading.enumerate()) == baseline_threads
    assert sent < len(files[1]["large.bin"]) // 2


def test_a_consumer_that_does_not_read_bounds_the_parts(server, files):
    options = FAST.replace(parallel_parts=3, part_size=512 * KIB, prefetch_bytes=256 * KIB)
    stream = open_stream(server.url("large.bin"), options=options)
    try:
        time.sleep(0.5)  # unthrottled, the whole 8 MiB would be here by now
        sent = server.stats.bytes_sent
        time.sleep(0.2)
        assert server.stats.bytes_sent == sent
        # parts in memory + the prefetch + kernel / aiohttp buffers, well short of the file
        assert sent <= 3 * 512 * KIB + 256 * KIB + 2 * MIB
        assert b"".join(stream) == files[1]["large.bin"]
    finally:
        stream.close()


def test_options_are_validated():
    for bad in ({"parallel_parts": 0}, {"parallel_parts": 1.5}, {"part_size": 0}, {"part_budget": -1}):
        with pytest.raises(ValueError):
            FetchOptions(**bad)
    defaults = FetchOptions()
    assert defaults.parallel_parts == 32 and defaults.part_size is None and defaults.part_budget == 64 * MIB


# --- one path to storage: a registered scheme reaches every reader ---------------------------------


def test_a_registered_scheme_reaches_the_loader_gopen_and_the_cli(tmp_path, capsys):
    import io
    import json
    import tarfile

    import shardstream as wds
    from shardstream._fetch.registry import register_fetcher
    from shardstream.cli import main

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i in range(3):
            info = tarfile.TarInfo(f"s{i}.txt")
            info.size = 2
            tar.addfile(info, io.BytesIO(b"hi"))
    blobs = {"vault://bucket/a.tar": buf.getvalue()}
    asked = []

    async def vault(url, *, options, start=0):
        asked.append(url)
        if url not in blobs:
            raise ShardNotFound("no such blob", url=url)
        yield blobs[url][start:]

    previous = register_fetcher("vault", vault)
    try:
        assert [s["__key__"] for s in wds.WebDataset("vault://bucket/a.tar", shardshuffle=False)] == ["s0", "s1", "s2"]
        assert wds.gopen("vault://bucket/a.tar").read() == blobs["vault://bucket/a.tar"]
        assert main(["verify", "vault://bucket/a.tar"]) == 0
        assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["samples"] == 3
        with pytest.raises(ShardNotFound, match="no such blob"):
            list(wds.WebDataset("vault://bucket/missing.tar", shardshuffle=False))
        assert len(asked) >= 4  # every reader went through the registered fetcher
    finally:
        register_fetcher("vault", previous)


def _answer(request, body: bytes, etag: str) -> web.Response:
    """As RFC 9110 has it: the whole body without a Range, or with an If-Range that is not
    `etag`; else a 206 of the range."""
    ranged = request.headers.get("Range")
    if ranged is None or request.headers.get("If-Range", etag) != etag:
        return web.Response(body=body, headers={"ETag": etag})
    return _partial(body, ranged, etag)


def _partial(body: bytes, ranged: str, etag: str) -> web.Response:
    """A 206 for `Range: bytes=first-[last]` of `body`, with its ETag."""
    first, last = ranged[6:].split("-")
    first, last = int(first), min(int(last or len(body) - 1), len(body) - 1)
    return web.Response(status=206, body=body[first:last + 1], headers={
        "ETag": etag, "Content-Range": f"bytes {first}-{last}/{len(body)}"})


def test_a_server_that_ignores_if_range_is_asked_again_without_it(tmp_path):
    """A server that answers every If-Range request with its whole body (a 200 with the same
    ETag, where RFC 9110 wants a 206) once had every part read the object from byte 0 up to its
    own range. The part asks again without If-Range, and the other parts learn it."""
    import shardstream as wds
    from shardsets import write_tar

    path = write_tar(str(tmp_path / "a.tar"), [(f"s{i:04d}.bin", bytes([i]) * 4096) for i in range(256)])
    body, etag = Path(path).read_bytes(), '"v1"'
    requests = []

    async def handle(request):
        ranged, if_range = request.headers.get("Range"), request.headers.get("If-Range")
        requests.append((ranged, if_range))
        if ranged is None or if_range is not None:
            return web.Response(body=body, headers={"ETag": etag})
        return _partial(body, ranged, etag)

    runner, url = serve_app(handle)
    try:
        options = FetchOptions(parallel_parts=4, part_size=64 << 10, retries=0)
        got = [s["bin"] for s in wds.WebDataset(url.replace(".bin", ".tar"), shardshuffle=False, fetch_options=options)]
        assert got == [bytes([i]) * 4096 for i in range(256)]
        parts = -(-len(body) // (64 << 10))
        asked = [r for r in requests if r[0] is not None]
        assert len(asked) >= parts > 8, requests
        assert 1 <= sum(1 for _r, if_range in asked if if_range) <= 4, requests  # those in flight at once, at most
    finally:
        run_coroutine(runner.cleanup()).result(5)


def test_a_pool_of_servers_that_tag_one_file_differently_is_read_whole(tmp_path, caplog):
    """Two servers behind one name, answering in turn, whose copies of a file carry different
    ETags (Apache's inode ETags, say): every part answered by the other server once failed the
    shard as "object changed". A response of the same size tagged differently is asked again, at
    once, with one WARNING; the samples are those of the file."""
    import logging

    import shardstream as wds
    from shardsets import write_tar

    path = write_tar(str(tmp_path / "a.tar"), [(f"s{i:04d}.bin", bytes([i]) * 4096) for i in range(256)])
    body = Path(path).read_bytes()
    served = []

    async def handle(request):  # round robin over two copies
        etag = ('"copy-a"', '"copy-b"')[len(served) % 2]
        served.append(etag)
        return _answer(request, body, etag)

    runner, url = serve_app(handle)
    try:
        options = FetchOptions(parallel_parts=4, part_size=64 << 10, retries=0)
        with caplog.at_level(logging.WARNING, logger="shardstream"):
            got = [s["bin"] for s in wds.WebDataset(url.replace(".bin", ".tar"), shardshuffle=False,
                                                    fetch_options=options)]
        assert got == [bytes([i]) * 4096 for i in range(256)]
        assert len(served) > -(-len(body) // (64 << 10)) + 4  # (parts the other copy answered were asked again)
        told = [r.getMessage() for r in caplog.records if "tags the object differently" in r.getMessage()]
        assert len(told) == 1 and "copy-" in told[0]
    finally:
        run_coroutine(runner.cleanup()).result(5)


def test_an_object_replaced_mid_download_is_an_error_not_two_versions_spliced(tmp_path):
    """Every part of a parted download asks for the object the first response described (its
    ETag, in If-Range) and refuses another: an object replaced between parts (same size, new
    contents) once gave a pass of samples from both versions, with no error."""
    import shardstream as wds
    from shardsets import write_tar

    versions = []
    for tag in (b"A", b"B"):
        path = write_tar(str(tmp_path / f"{tag.decode()}.tar"), [(f"s{i:04d}.bin", tag * 4096) for i in range(64)])
        versions.append((f'"{tag.decode()}"', Path(path).read_bytes()))
    assert len(versions[0][1]) == len(versions[1][1])
    requests = []

    async def handle(request):  # version A for the first 3 requests, B after
        etag, body = versions[0] if len(requests) < 3 else versions[1]
        requests.append(request.headers.get("Range"))
        return _answer(request, body, etag)

    runner, url = serve_app(handle)
    try:
        options = FetchOptions(parallel_parts=8, part_size=64 << 10, retries=1, backoff_base=0.01)
        with pytest.raises(FetchError, match="changed.*asked 17 times.*parallel_parts=1"):
            list(wds.WebDataset(url.replace(".bin", ".tar"), shardshuffle=False, fetch_options=options))
        assert len(requests) > 3
    finally:
        run_coroutine(runner.cleanup()).result(5)


def test_closing_a_pass_sends_no_new_requests(tmp_path):
    """Closing a pass closes its streams one by one, the one being read first; the budget each
    freed was granted to the waiting parts of the next, which sent requests only to drop them
    (15 requests became 36 here; S3 bills each). Now: none once close() begins."""
    import collections
    import os
    import random

    import shardstream as wds

    rng = random.Random(5)
    for n in range(8):
        with wds.TarWriter(str(tmp_path / f"b-{n}.tar")) as sink:
            for i in range(1500):
                sink.write({"__key__": f"k{n}_{i:04d}", "bin": rng.randbytes(2048)})
    with ShardServer(str(tmp_path), bandwidth=2e6, latency_ms=50) as srv:
        ds = wds.WebDataset([srv.url(f"b-{n}.tar") for n in range(8)], shardshuffle=False).to_tuple("__key__").batched(8)
        it = iter(ds)
        for _ in range(20):
            next(it)
        before = collections.Counter(srv.stats.fetches)
        it.close()
        time.sleep(0.3)  # (past the grant put off after a close)
        assert collections.Counter(srv.stats.fetches) == before
    assert os.path.getsize(tmp_path / "b-0.tar") > 3 * MIB  # (several parts each: some wait for the budget)
