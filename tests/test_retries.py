"""Retries and stalls are visible (`_retries`): the first retry of a transfer is a WARNING naming
the redacted URL, the reason and the attempt; a silent transfer is reported before its stall
timeout gives up on it."""

from __future__ import annotations

import logging
import re

import pytest

import shardstream as wds
import shardstream._fetch.retries as retries
from shardstream._fetch.stream import open_stream
from shardstream._fetch.options import FetchOptions

from looptools import write_files
from shardserver import ShardServer

KIB = 1 << 10


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_files(tmp_path_factory.mktemp("retries"), {"x.bin": 512 * KIB})


def _read(url, options):
    with open_stream(url, options=options) as stream:
        return b"".join(stream)


@pytest.mark.timeout(60)
def test_the_first_retry_is_a_warning_naming_url_reason_and_attempt(files, caplog):
    root, contents = files
    data = contents["x.bin"]
    options = FetchOptions(backoff_base=0.01, backoff_max=0.02, parallel_parts=1)
    with ShardServer(root) as server:
        server.options.fail_first = {"x.bin": 2}  # two 503s, then the body
        url = server.url("x.bin").replace("http://", "http://user:Zq9secret@") + "?token=Zq9tok"
        server.options.basic_auth = ("user", "Zq9secret")
        with caplog.at_level(logging.DEBUG, logger="shardstream"):
            assert _read(url, options) == data
    warnings_ = [r for r in caplog.records if r.levelno == logging.WARNING and "retry" in r.getMessage()]
    assert len(warnings_) == 1  # the first retry; the second is quieter
    message = warnings_[0].getMessage()
    assert "retry 1/8" in message and "503" in message and "x.bin" in message
    assert "Zq9secret" not in caplog.text and "Zq9tok" not in caplog.text


@pytest.mark.timeout(60)
@pytest.mark.parametrize("beside", [False, True])
def test_a_silent_transfer_is_reported_before_its_stall_timeout(files, caplog, beside):
    """A short stall_timeout is warned about in time: the watchdog looked once a second, so a
    transfer silent for 0.8 s under a 1.2 s timeout (warned at 0.4 s) went unreported; so it
    did when the watchdog was asleep for a second already (`beside`: a transfer under the
    default timeout was open)."""
    root, contents = files
    data = contents["x.bin"]
    options = FetchOptions(stall_timeout=1.2, parallel_parts=1, chunk_size=16 * KIB)  # warns after 0.4 s
    with ShardServer(root) as server:
        server.options.seed = 1
        server.options.stall_rate = 1.0
        server.options.stall_seconds = 0.8  # quiet for 0.8 s, then the rest: under the timeout
        other = open_stream(server.url("x.bin"), options=FetchOptions(parallel_parts=1)) if beside else None
        try:
            if other is not None:
                next(other)  # (its transfer is watched: the watchdog sleeps a second between looks)
            with caplog.at_level(logging.WARNING, logger="shardstream"):
                assert _read(server.url("x.bin"), options) == data
        finally:
            if other is not None:
                other.close()
    quiet = [r.getMessage() for r in caplog.records if "no bytes from" in r.getMessage()]
    assert len(quiet) == 1 and "x.bin" in quiet[0] and "stall_timeout" in quiet[0]
    assert 0.4 <= float(re.search(r" for ([\d.]+) s;", quiet[0]).group(1)) < 1.2, quiet  # (it said "for 0 s")


def _silent_read_in_child(url, queue):
    said = []

    class Keep(logging.Handler):
        def emit(self, record):
            said.append(record.getMessage())

    logging.getLogger("shardstream").addHandler(Keep())
    options = FetchOptions(stall_timeout=1.2, parallel_parts=1, chunk_size=16 * KIB)
    with open_stream(url, options=options) as stream:
        size = sum(len(chunk) for chunk in stream)
    queue.put((size, [m for m in said if "no bytes from" in m]))


@pytest.mark.timeout(60)
def test_a_forked_child_reports_its_own_silent_transfers(files):
    """A child forked while the parent's watchdog ran inherited that task (of the parent's loop,
    dead in the child) and never started its own: no stall was reported in a forked worker."""
    import multiprocessing

    root, contents = files
    with ShardServer(root) as server:
        server.options.seed = 1
        server.options.stall_rate = 1.0
        server.options.stall_seconds = 0.8
        other = open_stream(server.url("x.bin"), options=FetchOptions(stall_timeout=1.2, parallel_parts=1))
        try:
            next(other)  # (the parent's watchdog runs, looking as often as the child's would)
            fork = multiprocessing.get_context("fork")
            queue = fork.Queue()
            child = fork.Process(target=_silent_read_in_child, args=(server.url("x.bin"), queue))
            child.start()
            size, quiet = queue.get(timeout=30)
            child.join(10)
        finally:
            other.close()
    assert size == len(contents["x.bin"]) and len(quiet) == 1, quiet


@pytest.mark.timeout(60)
def test_a_back_off_is_not_reported_as_the_servers_silence(files, caplog, monkeypatch):
    """A 429 with Retry-After 2 s, under a stall timeout that warns after 1 s: the wait is ours,
    so the only warning is the retry's."""
    root, contents = files
    monkeypatch.setattr(retries, "TICK", 0.1)
    options = FetchOptions(stall_timeout=3.0, backoff_max=2.0, parallel_parts=1)
    with ShardServer(root) as server:
        server.options.fail_first, server.options.fail_first_fault = {"x.bin": 1}, "throttle"
        server.options.retry_after = 2
        with caplog.at_level(logging.WARNING, logger="shardstream"):
            assert _read(server.url("x.bin"), options) == contents["x.bin"]
    said = [r.getMessage() for r in caplog.records]
    assert [m for m in said if "no bytes from" in m] == [] and any("retry 1/8" in m and "429" in m for m in said)


def test_backoff_honours_retry_after_and_caps_jitter():
    options = wds.FetchOptions(backoff_base=0.5, backoff_max=4.0)
    assert retries.backoff_delay(options, 3, retry_after=30.0) == 4.0
    assert all(0 <= retries.backoff_delay(options, n) <= min(4.0, 0.5 * 2 ** (n - 1)) for n in range(1, 9) for _ in range(20))


@pytest.mark.timeout(60)
def test_a_dripping_body_is_a_stall(files, caplog):
    """A server that sends a little every 50 ms never falls silent for the read timeout: each
    attempt kept the transfer alive for ever (a few bytes a second on a 512 KiB shard). Under
    64 KiB per stall_timeout is a stall: retried, then an error naming the URL and offset."""
    root, _ = files
    options = FetchOptions(stall_timeout=1.0, retries=1, backoff_base=0.01, backoff_max=0.02, parallel_parts=1)
    with ShardServer(root) as server:
        server.options.bandwidth = 2000.0  # 100 bytes every 50 ms
        with caplog.at_level(logging.WARNING, logger="shardstream"):
            with pytest.raises(wds.FetchTimeout) as caught:
                _read(server.url("x.bin"), options)
    assert "stalled: under 64 KiB in 1 s" in str(caught.value) and "x.bin" in str(caught.value)
    assert 0 < caught.value.offset < 64 * KIB
    said = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("only ") and "x.bin" in m for m in said), said  # (warned before it gave up)
    assert any("retry 1/1" in m for m in said), said


@pytest.mark.timeout(60)
def test_a_slow_body_that_brings_64_kib_per_stall_timeout_is_no_stall(files):
    """The rule is a floor, not a read timeout of its own: 128 KiB/s under a 1 s stall_timeout
    (chunks every 50 ms, the reader holding each one a while) reads to the end."""
    root, contents = files
    options = FetchOptions(stall_timeout=1.0, retries=0, parallel_parts=1, chunk_size=16 * KIB)
    with ShardServer(root) as server:
        server.options.bandwidth = 128 * KIB
        with open_stream(server.url("x.bin"), options=options) as stream:
            got = []
            for chunk in stream:
                got.append(chunk)
    assert b"".join(got) == contents["x.bin"]
