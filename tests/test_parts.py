"""Ranged parts under one process-wide byte budget (`_parts`): exact bytes whatever the order
streams are read in, a reader never waits for the budget, and memory stays within it."""

from __future__ import annotations

import collections
import random
import threading
import time

import pytest

import shardstream._fetch.parts as parts
from shardstream._fetch.stream import open_stream
from shardstream._fetch.options import FetchOptions
from shardstream._fetch.loop import run_coroutine

from looptools import write_files
from shardserver import ShardServer

KIB = 1 << 10
PART = 64 * KIB
SIZES = {f"s{i}.bin": 600 * KIB + 37 * i for i in range(6)}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_files(tmp_path_factory.mktemp("parts"), SIZES)


@pytest.fixture
def budget(monkeypatch):
    """A fresh process budget for each test (the module keeps one per process)."""
    monkeypatch.setattr(parts, "_budget", None)
    yield
    monkeypatch.setattr(parts, "_budget", None)


def _options(budget_bytes):
    return FetchOptions(backoff_base=0.01, backoff_max=0.05, chunk_size=16 * KIB, prefetch_bytes=64 * KIB,
                        stall_timeout=5, parallel_parts=4, part_size=PART, part_budget=budget_bytes)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("order", ["in order", "last first", "interleaved"])
def test_exact_bytes_whatever_the_reading_order(files, budget, order):
    root, data = files
    names = sorted(SIZES)
    with ShardServer(root) as server:
        streams = {name: open_stream(server.url(name), options=_options(2 * PART)) for name in names}
        got = {name: bytearray() for name in names}
        try:
            if order == "in order":
                for name in names:
                    for chunk in streams[name]:
                        got[name] += chunk
            elif order == "last first":  # a later stream read first: its front is granted on demand
                for name in reversed(names):
                    for chunk in streams[name]:
                        got[name] += chunk
            else:
                rng, live = random.Random(3), {name: iter(streams[name]) for name in names}
                while live:
                    name = rng.choice(sorted(live))
                    chunk = next(live[name], None)
                    if chunk is None:
                        del live[name]
                    else:
                        got[name] += chunk
        finally:
            for stream in streams.values():
                stream.close()
    assert {name: bytes(b) for name, b in got.items()} == {name: data[name] for name in names}


@pytest.mark.timeout(60)
def test_memory_stays_within_the_budget(files, budget):
    root, data = files
    limit = 3 * PART
    peak = [0]
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            if parts._budget is not None:
                peak[0] = max(peak[0], parts._budget.used)
            time.sleep(0.001)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with ShardServer(root) as server:
            server.options.bandwidth = 4e6  # slow enough for parts to queue up
            streams = [open_stream(server.url(name), options=_options(limit)) for name in sorted(SIZES)]
            try:
                for name, stream in zip(sorted(SIZES), streams):
                    assert b"".join(stream) == data[name]
            finally:
                for stream in streams:
                    stream.close()
    finally:
        stop.set()
        watcher.join()
    assert 0 < peak[0] <= limit
    assert parts._budget.used == 0 and parts._budget.unread == 0  # everything given back


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cap", [2 * PART, None])
def test_parts_stop_reading_while_their_bytes_wait_unread(files, budget, monkeypatch, cap):
    """The budget keeps its requests in flight, not all their bytes in the heap: past UNREAD_CAP
    bytes received and not yet read, parts nobody waits for stop reading their connections (TCP
    holds the rest) until the reader takes some. The part the reader waits for never pauses.
    Without the cap (None), a reader that pauses lets every granted part land in memory."""
    if cap is not None:
        monkeypatch.setattr(parts, "UNREAD_CAP", cap)
    root, data = files
    names = sorted(SIZES)[:2]
    options = _options(16 * PART).replace(parallel_parts=4)
    peak = [0]
    with ShardServer(root) as server:
        streams = [open_stream(server.url(name), options=options) for name in names]
        try:
            got = [bytearray(next(iter(streams[0])))]
            deadline = time.monotonic() + 0.6  # the reader pauses (a training step)
            while time.monotonic() < deadline:
                peak[0] = max(peak[0], parts._budget.unread)
                time.sleep(0.005)
            got[0] += b"".join(streams[0])
            got.append(bytearray(b"".join(streams[1])))
        finally:
            for stream in streams:
                stream.close()
    assert [bytes(g) for g in got] == [data[name] for name in names]
    slack = 2 * 4 * options.chunk_size + PART  # a chunk past the cap per part, and the front part
    if cap is not None:
        assert 0 < peak[0] <= cap + slack
    else:
        assert peak[0] > 2 * PART + slack  # (what makes the test above tell)
    assert parts._budget.unread == 0 and parts._budget.used == 0


def test_a_stream_closed_with_parts_received_gives_their_bytes_back(files, budget, monkeypatch):
    monkeypatch.setattr(parts, "UNREAD_CAP", PART)
    root, data = files
    name = sorted(SIZES)[0]
    with ShardServer(root) as server:
        stream = open_stream(server.url(name), options=_options(16 * PART))
        first = next(iter(stream))
        time.sleep(0.3)  # (parts ahead receive, then pause)
        assert parts._budget.unread > 0
        stream.close()
    assert data[name].startswith(first)
    assert parts._budget.unread == 0


def test_the_budget_grants_in_reading_order():
    async def scenario():
        budget = parts.PartBudget(2 * PART)
        made = [parts._Part(0, PART, (stream, index)) for stream, index in [(2, 0), (1, 1), (1, 0), (3, 0)]]
        holders = [parts._Part(0, PART, (0, i)) for i in range(2)]
        for part in holders:
            await budget.acquire(part)  # the budget is full
        waiting = [asyncio.ensure_future(budget.acquire(part)) for part in made]
        await asyncio.sleep(0)
        granted = []
        for part in holders:
            budget.release(part)
            await asyncio.sleep(0)
            granted += [p.key for p in made if p.held and p.key not in granted]
        budget.promote(made[3])  # a reader waits for stream 3: granted at once, holding nothing
        await asyncio.sleep(0)
        for task in waiting:
            task.cancel()
        return granted, made[3].held, waiting[3].done()

    import asyncio

    granted, held, done = run_coroutine(scenario()).result(5)
    assert granted == [(1, 0), (1, 1)]  # the earliest needed first
    assert held == 0 and done


def test_part_size_follows_what_transfers_show(monkeypatch):
    tuning = parts._Tuning()
    assert tuning.part_size(2 << 20) == 2 << 20  # nothing measured yet
    tuning.record(ttfb=0.05, nbytes=4 << 20, seconds=4 / 25)  # 50 ms to first byte, 25 MiB/s
    assert tuning.part_size(2 << 20) == int(2 * 0.05 * (25 << 20))
    fast = parts._Tuning()
    fast.record(ttfb=0.0001, nbytes=1 << 30, seconds=1.0)
    assert fast.part_size(2 << 20) == parts.MIN_PART  # a fast local server: small parts suffice
    for _ in range(30):  # a slow, distant one: large parts, within the cap
        tuning.record(ttfb=0.5, nbytes=64 << 20, seconds=1.0)
    assert tuning.part_size(2 << 20) == parts.MAX_PART


def test_a_forked_child_starts_with_a_fresh_budget(budget):
    import os

    async def hold():
        parts.part_budget(4 * PART).used = 3 * PART  # as if parts were in flight at the fork

    run_coroutine(hold()).result(5)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no parts in flight, nothing held
        os.write(write, b"1" if parts._budget is None else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 1) == b"1"
    assert parts._budget.used == 3 * PART  # the parent's is untouched
    parts._budget.used = 0


def test_a_reader_window_keeps_shards_opened_ahead_from_taking_the_budget():
    """The streams a reader opened ahead wait until the ones before it say their size and the
    reader is within the budget of their start: the shard being read gets the connections."""

    async def scenario():
        budget = parts.PartBudget(4 * PART)
        reader = object()
        current, ahead = budget.open(reader, 0), budget.open(reader, 0)
        other = budget.open(None, 0)  # another reader's stream: its own window
        other_part = parts._Part(0, PART, (2, 0), other)
        head = parts._Part(0, PART, (1, 0), ahead)
        front = parts._Part(0, PART, (0, 0), current)
        waiting = {"head": asyncio.ensure_future(budget.acquire(head)),
                   "front": asyncio.ensure_future(budget.acquire(front)),
                   "other": asyncio.ensure_future(budget.acquire(other_part))}
        await asyncio.sleep(0)
        log = [sorted(name for name, task in waiting.items() if task.done())]  # size of `current` unknown
        budget.sized(current, 10 * PART)
        rest = [parts._Part(i * PART, (i + 1) * PART, (0, i), current) for i in range(1, 10)]
        tasks = [asyncio.ensure_future(budget.acquire(part)) for part in rest]
        await asyncio.sleep(0)
        log.append(sum(task.done() for task in tasks))  # the window: bytes 0 to 4 parts
        log.append(waiting["head"].done())
        budget.release(other_part)  # (all four held parts now belong to `current`)
        for part in [front] + rest[:6]:  # the reader hands on 7 parts
            current.read_to = part.stop
            budget.release(part)
            await asyncio.sleep(0)
        log.append(sum(task.done() for task in tasks))
        log.append(waiting["head"].done())  # 3 parts left of `current` + its first part: within 4
        for task in [*waiting.values(), *tasks]:
            task.cancel()
        return log

    import asyncio

    log = run_coroutine(scenario()).result(5)
    assert log[0] == ["front", "other"]  # the head waits: its reader reads `current` first, size unknown
    assert log[1] == 2  # parts 1-2 join part 0 and the other reader's part: 4 parts held
    assert log[2] is False  # `current` has 10 parts: the head is far beyond the window
    assert log[3] == 9 and log[4] is True


@pytest.mark.timeout(60)
def test_the_shard_being_read_gets_the_connections(tmp_path, budget):
    """Through WebDataset: shards opened ahead (shards_in_flight=8) send no request while the
    reader is far from them; the shard being read is fetched over several connections; every
    sample arrives."""
    import shardstream as wds

    names = [f"s{i}.tar" for i in range(4)]
    payload = bytes(range(256)) * 16  # 4 KiB
    for name in names:
        with wds.TarWriter(str(tmp_path / name)) as sink:
            for k in range(1024):  # ~4.5 MiB a shard, far beyond the budget
                sink.write({"__key__": f"{name[:2]}-{k:04d}", "bin": payload})
    options = FetchOptions(part_size=PART, part_budget=8 * PART, parallel_parts=4, stall_timeout=5)
    with ShardServer(tmp_path) as server:
        server.options.latency_ms = 5
        urls = [server.url(name) for name in names]
        samples = iter(wds.WebDataset(urls, shardshuffle=False, fetch_options=options, shards_in_flight=8))
        keys = [next(samples)["__key__"]]
        time.sleep(0.5)  # the reader holds one sample; the stages ahead fill their queues
        snapshot = server.stats.snapshot()
        early = snapshot.fetches
        keys += [sample["__key__"] for sample in samples]
    assert early["s0.tar"] >= 4  # the shard being read: ranged parts
    assert early["s2.tar"] == early["s3.tar"] == 0  # far beyond the window: at most the size asked for
    assert snapshot.size_probes["s2.tar"] <= 1 and snapshot.size_probes["s3.tar"] <= 1
    assert len(keys) == 4 * 1024 and len(set(keys)) == len(keys)


@pytest.mark.timeout(60)
def test_two_readers_in_one_process_share_the_budget_and_both_finish(tmp_path, budget):
    """Two passes read in turns (as a mix of two datasets does): each is a reader with its own
    window under the one process budget; neither starves the other, every sample arrives."""
    import shardstream as wds

    payload = bytes(range(256)) * 16
    for name in ("a0", "a1", "b0", "b1"):
        with wds.TarWriter(str(tmp_path / f"{name}.tar")) as sink:
            for k in range(256):
                sink.write({"__key__": f"{name}-{k:03d}", "bin": payload})
    options = FetchOptions(part_size=PART, part_budget=6 * PART, parallel_parts=4, stall_timeout=5)
    with ShardServer(tmp_path) as server:
        first, second = (
            iter(wds.WebDataset([server.url(f"{p}{i}.tar") for i in range(2)], shardshuffle=False,
                                fetch_options=options))
            for p in "ab"
        )
        keys = []
        for a, b in zip(first, second):
            keys += [a["__key__"], b["__key__"]]
            assert a["bin"] == b["bin"] == payload
    assert len(keys) == 2 * 512 and len(set(keys)) == len(keys)


@pytest.mark.timeout(60)
def test_shards_opened_together_learn_their_sizes_together(tmp_path, budget):
    """Six small shards opened at once behind a 200 ms time to first byte: each may place its parts
    in the window only once the shards before it said their size, and without asking for it each
    learned it from its own first part, one after the other (six round trips: >= 1.2 s). Each asks
    for one byte at once instead: about two round trips for the whole pass."""
    import shardstream as wds

    names = [f"t{i}.tar" for i in range(6)]
    for name in names:
        with wds.TarWriter(str(tmp_path / name)) as sink:
            for k in range(32):  # ~150 KiB: three parts each
                sink.write({"__key__": f"{name[:2]}-{k:03d}", "bin": bytes(4 * KIB)})
    options = FetchOptions(part_size=PART, part_budget=64 * PART, parallel_parts=8, stall_timeout=5)
    with ShardServer(tmp_path, latency_ms=200) as server:
        urls = [server.url(name) for name in names]
        list(wds.WebDataset(urls[:1], shardshuffle=False, fetch_options=options))  # (connections, imports)
        started = time.perf_counter()
        keys = [s["__key__"] for s in wds.WebDataset(urls, shardshuffle=False, fetch_options=options,
                                                     shards_in_flight=8)]
        elapsed = time.perf_counter() - started
    assert len(keys) == 6 * 32 and len(set(keys)) == len(keys)
    assert elapsed < 6 * 0.2, f"{elapsed:.2f} s: the sizes came one round trip after another"


def test_a_window_follows_what_its_reader_consumes():
    """Twice the bytes consumed per part latency; doubling (once per latency) when the reader
    waits for a part held back until late (`PartBudget.starve` decides that: below); narrowing by at most exp(-t / NARROWING); within the floor
    and the budget."""
    mib, limit, latency = 1 << 20, 64 << 20, 0.1
    reader = parts._Reader(window=16 * mib, floor=4 * mib)
    assert reader.starve(limit, 0.0, latency) is False  # nothing consumed yet: waiting says nothing
    reader.consume(mib, limit, 0.0, latency)  # the first bytes: the clock starts
    assert reader.window == 16 * mib
    reader.consume(9 * mib, limit, 0.05, latency)  # (less than a latency: not measured yet)
    reader.consume(1 * mib, limit, 0.1, latency)  # 10 MiB in 0.1 s: 2 x 0.1 s x 100 MiB/s
    assert reader.window == 20 * mib
    assert reader.starve(limit, 0.15, latency) is True and reader.window == 40 * mib
    assert reader.starve(limit, 0.2, latency) is False  # once per latency
    assert reader.starve(limit, 0.26, latency) is True and reader.window == limit
    windows = []
    for step in range(1, 31):  # then it consumes 0.1 MiB per 0.1 s: the window narrows, slowly
        reader.consume(mib // 10, limit, 0.3 + 0.1 * step, latency)
        windows.append(reader.window)
    assert windows[3] > limit / 2  # 0.6 s after the last measure: at most halved in ~0.7 s
    assert windows[-1] == 4 * mib  # down to the floor


@pytest.mark.timeout(60)
def test_each_origin_has_its_own_measurements(tmp_path, monkeypatch):
    """Part sizes and windows come from the times of the stream's own origin (scheme and host):
    reading from a near server does not shorten what a far one's parts are measured to take."""
    monkeypatch.setattr(parts, "_tunings", collections.OrderedDict())
    root, data = write_files(tmp_path, {"a.bin": 4 << 20})
    options = FetchOptions(part_size=512 * KIB, stall_timeout=5)
    with ShardServer(root, latency_ms=5) as near, ShardServer(root, latency_ms=150) as far:
        for server in (far, near, near):
            stream = open_stream(server.url("a.bin"), options=options)
            try:
                assert b"".join(stream) == data["a.bin"]
            finally:
                stream.close()
        near_tuning, far_tuning = parts.tuning_for(near.url("a.bin")), parts.tuning_for(far.url("x"))
    assert near_tuning is not far_tuning and len(parts._tunings) == 2
    assert near_tuning.ttfb < 0.1 <= far_tuning.ttfb
    assert far_tuning.latency > near_tuning.latency + 0.1
    assert parts.origin_of("http://user:secret@Example.COM:8080/a/b.tar?x=1") == "http://example.com:8080"
    assert parts.origin_of("s3://bucket/key/shard.tar") == "s3://bucket"
    assert parts.origin_of("https://host?X-Amz-Signature=abc") == "https://host"  # no query in the key


def test_a_window_widens_only_for_a_part_it_held_back():
    """`PartBudget.starve(front)`: the reader waits for a part with no bytes yet that was granted
    less than a latency ago, or not yet (held back), so its window widens; a part granted long ago
    that is late (the server's doing), or one whose bytes are there, changes nothing."""
    tuning = parts._Tuning()
    tuning.latency = 0.1
    budget = parts.PartBudget(64 << 20)
    reading = budget.open(object(), 0, PART, tuning)
    reader = budget._readers[reading.group]
    reader.consume(PART, budget.limit, time.perf_counter(), tuning.latency)  # its first bytes: waits count from now
    start = reader.window
    late = parts._Part(0, PART, (0, 0), reading)
    late.granted = time.perf_counter() - 1.0  # granted a second ago, still no byte
    budget.starve(late)
    arrived = parts._Part(PART, 2 * PART, (0, 1), reading)
    arrived.chunks.append(b"x")
    budget.starve(arrived)
    assert reader.window == start
    held = parts._Part(2 * PART, 3 * PART, (0, 2), reading)  # not granted yet
    budget.starve(held)
    assert reader.window == 2 * start
    recent = parts._Part(3 * PART, 4 * PART, (0, 3), reading)
    recent.granted = time.perf_counter()
    reader.widened -= 1.0  # (a latency later)
    budget.starve(recent)
    assert reader.window == 4 * start


@pytest.mark.timeout(60)
def test_a_slow_reader_keeps_a_small_window_a_fast_one_widens_it(tmp_path, budget, monkeypatch):
    """A reader that consumes 8 MB/s, from a server 20 ms + 128 KiB / 8 MB/s away (~2 x 0.05 s x
    8 MB/s = 0.8 MB wanted), keeps a window near its 1 MiB floor (2 MiB measured; the bounds leave
    room for a doubling or two when a loaded machine stalls the reader), and the server about that
    window and the stream's buffer ahead of it, not the whole 64 MiB budget (which holds nearly the
    whole object: the server ran 14.6 MiB ahead before windows followed their readers, 1.9 MiB
    after). One that reads as fast as it can waits for parts its window let start late, and its
    window widens."""
    mib = 1 << 20
    monkeypatch.setattr(parts, "_tunings", collections.OrderedDict())
    monkeypatch.setattr(parts, "START_WINDOW", mib)
    monkeypatch.setattr(parts, "MIN_WINDOW", mib)
    starved = []
    starve = parts._Reader.starve
    monkeypatch.setattr(parts._Reader, "starve", lambda self, *a: starved.append(starve(self, *a)) or starved[-1])
    options = FetchOptions(part_size=128 * KIB, prefetch_bytes=256 * KIB, chunk_size=64 * KIB, parallel_parts=128,
                           stall_timeout=5)

    def windows():
        return max([0] + [reader.window for reader in list(parts._budget._readers.values())])

    root, data = write_files(tmp_path, {"slow.bin": 16 * mib, "fast.bin": 16 * mib})
    with ShardServer(root, latency_ms=20) as server:
        server.options.bandwidth = 8e6
        lead, slow_window, got = 0, 0, bytearray()
        stream = open_stream(server.url("slow.bin"), options=options)
        try:
            started = time.perf_counter()
            for chunk in stream:
                got += chunk
                lead = max(lead, server.stats.bytes_sent - len(got))
                slow_window = max(slow_window, windows())
                time.sleep(max(0.0, started + len(got) / 8e6 - time.perf_counter()))
        finally:
            stream.close()
        assert bytes(got) == data["slow.bin"]
        del starved[:]
        fast_window, got = 0, bytearray()
        stream = open_stream(server.url("fast.bin"), options=options)
        try:
            for chunk in stream:
                got += chunk
                fast_window = max(fast_window, windows())
        finally:
            stream.close()
        assert bytes(got) == data["fast.bin"]
    assert slow_window <= 8 * mib, f"an 8 MB/s reader's window reached {slow_window / mib:.1f} MiB"
    # its window + the stream's buffer (256 KiB) + the part arriving + a chunk
    assert lead <= 9 * mib, f"the server ran {lead / mib:.1f} MiB ahead of an 8 MB/s reader"
    assert True in starved and fast_window >= 2 * slow_window  # the fast reader widened its window


def test_a_server_that_ignores_range_gives_the_budget_back(tmp_path, budget):
    """A shard's first part is granted its bytes before the response says the server sends no
    ranges; the stream then reads over one connection, and those bytes stayed used for ever. Each
    pass over such a server took ~6 MiB of the process's 64 MiB: after a few, every later
    download in the process, from any server, waited for budget and lost its parallel parts."""
    import os

    from aiohttp import web
    from looptools import serve_app
    from shardsets import tar_bytes

    import shardstream as wds

    shards = [tar_bytes([(f"s{i}-{n:02d}.bin", os.urandom(24 * KIB)) for n in range(20)]) for i in range(4)]

    async def handle(request):  # (no Range, no ETag)
        return web.Response(body=shards[int(request.match_info["path"].split(".")[0])])

    runner, url = serve_app(handle)
    base = url.rsplit("/", 1)[0]
    try:
        for _ in range(2):
            samples = list(wds.WebDataset([f"{base}/{i}.tar" for i in range(4)], shardshuffle=False))
            assert len(samples) == 80
    finally:
        run_coroutine(runner.cleanup()).result(5)
    assert parts._budget is not None and parts._budget.used == 0 and parts._budget.unread == 0


def test_a_grant_put_off_when_its_loop_is_shut_down_is_made_on_the_next_loop():
    """What a stream closed part way frees is granted 50 ms later; a loop shut down in between
    (`shutdown_loop`: the CLI, a test) left that timer for ever pending on the dead loop, and no
    put-off grant was made again in the process."""
    import asyncio

    from shardstream._fetch.loop import shutdown_loop

    budget = parts.PartBudget(PART)

    async def close_part_way():
        holder = parts._Part(0, PART, (0, 0))
        await budget.acquire(holder)  # the budget is full
        waiting = parts._Part(0, PART, (1, 0))
        task = asyncio.ensure_future(budget.acquire(waiting))
        await asyncio.sleep(0)
        budget.release(holder, at_once=False)  # a stream closed part way
        return waiting, task

    run_coroutine(close_part_way()).result(5)
    shutdown_loop()  # before the put-off grant
    waiting, _task = run_coroutine(close_part_way()).result(5)
    time.sleep(0.3)

    async def held():
        return waiting.held

    assert run_coroutine(held()).result(5) == PART  # granted on the new loop
