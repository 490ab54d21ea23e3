"""The receive low-water mark (`_fetch/lowat.py`) against a real HTTP server: a wake-up carries a
batch of a fast transfer's bytes, and the mark never holds back bytes a reader needs (a server
that stalls mid-body, a reader that stops pulling near a body's end)."""

from __future__ import annotations

import statistics
import sys
import time

import pytest
from looptools import write_files

from shardstream._fetch import lowat
from shardstream._fetch.loop import run_coroutine
from shardstream._fetch.options import FetchOptions
from shardstream._fetch.registry import fetch_stream
from shardstream._fetch.stream import open_stream

pytestmark = [
    pytest.mark.timeout(30),
    pytest.mark.skipif(not lowat.ENABLED, reason="the receive low-water mark is used on Linux only"),
]

KIB, MIB = 1 << 10, 1 << 20
OPTIONS = FetchOptions(backoff_base=0.01, backoff_max=0.05, chunk_size=256 * KIB, prefetch_bytes=1 * MIB,
                       stall_timeout=5, parallel_parts=1)
SIZES = {"big.bin": 2 * MIB + 3, **{f"tail{i}.bin": size for i, size in enumerate((600_000, 700_000, 900_000))}}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_files(tmp_path_factory.mktemp("served"), SIZES, seed=1)



def _chunk_sizes(url, options):
    async def sizes():
        return [len(chunk) async for chunk in fetch_stream(url, options=options)]

    return run_coroutine(sizes()).result(20)


def test_a_wake_up_carries_a_batch_of_the_servers_writes(server, files):
    """The server writes 16 KiB at a time, at 8 MB/s: without the mark, each write is a chunk."""
    server.options.chunk_size, server.options.bandwidth = 16 * KIB, 8e6
    sizes = _chunk_sizes(server.url("big.bin"), OPTIONS)
    assert sum(sizes) == len(files[1]["big.bin"])
    assert statistics.median(sizes) >= 3 * 16 * KIB, sizes


def test_bytes_sent_before_a_server_stall_arrive_during_it(server, files):
    """The bytes before a stall, past the last whole batch, are fewer than the mark: they must not
    wait for the stall's end (the watchdog drops the mark of a transfer that gets nothing)."""
    data = files[1]["big.bin"]
    server.options.fail_first_fault, server.options.stall_seconds = "stall", 1.5
    server.options.bandwidth = 16e6  # (batches of ~160 KiB)
    for fraction in (0.3, 0.41, 0.53):  # (a cut at a batch's end holds nothing back: try three)
        server.options.cut_fraction, server.options.fail_first = fraction, {"big.bin": 1}
        cut = int(len(data) * fraction)
        got, arrived = 0, None
        started = time.monotonic()
        with open_stream(server.url("big.bin"), options=OPTIONS) as stream:
            for chunk in stream:
                got += len(chunk)
                if arrived is None and got >= cut:
                    arrived = time.monotonic() - started
        assert got == len(data)
        assert arrived is not None and arrived < 0.75, f"the {cut} bytes before the stall took {arrived:.2f} s"
    assert server.stats.faults["stall"] == 3


def test_a_reader_that_stops_near_a_bodys_end_is_not_timed_out(server, files):
    """The reader stops pulling for three stall timeouts with the body's last bytes still in the
    kernel, fewer than the mark: they must arrive (else aiohttp's read timeout fires: a retry)."""
    options = OPTIONS.replace(stall_timeout=0.5, prefetch_bytes=256 * KIB)
    server.options.bandwidth = 16e6  # (batches of ~160 KiB)
    for name in ("tail0.bin", "tail1.bin", "tail2.bin"):  # (where the reader stops: 64 KiB in)
        with open_stream(server.url(name), options=options) as stream:
            first = next(stream)
            time.sleep(1.5)
            assert first + b"".join(stream) == files[1][name]
            assert stream.stats.retries == 0, name

