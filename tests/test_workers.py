"""The pools that serve until the process ends (`_base/workers.py`): a training loop in a thread
of its own keeps reading after the main thread returned."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import CancelledError, ThreadPoolExecutor

import pytest
from looptools import serve_app
from aiohttp import web

from shardsets import sample_members, write_tar
from shardstream._base.workers import WorkerPool
from shardstream._fetch.loop import run_coroutine

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The same pass twice: in the main thread, then in a thread that starts it after the main thread
# returned (when Python shuts down every concurrent.futures pool), with the engine's decode pool,
# every shard counted (rank 0 of 2: read_counts' pool) and, over HTTP on asyncio's loop, a host
# name that the event loop's executor resolves.
_CHILD = r"""
import json, sys, threading, time
import shardstream as wds

def one_pass(urls):
    split = wds.EqualSplit(shuffle=False, count_shards=True)
    ds = wds.WebDataset(urls, shardshuffle=False, nodesplitter=split).with_engine(threads=2)
    return [key for key, _ in ds.decode("pil").to_tuple("__key__", "jpg")]

before = one_pass(sys.argv[1])
main_returned = threading.Event()

def train():
    main_returned.wait()
    time.sleep(0.5)  # (the interpreter's exit has begun: the stdlib's pools are shut down)
    print(json.dumps({"before": before, "after": one_pass(sys.argv[-1])}), flush=True)

threading.Thread(target=train).start()  # (not a daemon: Python waits for it)
main_returned.set()
"""


def _shards(root) -> list:
    return [write_tar(os.path.join(root, f"w-{shard}.tar"), [m for i in range(shard * 8, shard * 8 + 8)
                                                             for m in sample_members(i)]) for shard in range(3)]


def _passes(*urls: str) -> dict:
    """The child's two passes, the second over the last of `urls`."""
    env = dict(os.environ, SHARDSTREAM_UVLOOP="0", PYTHONPATH=ROOT, RANK="0", WORLD_SIZE="2")
    done = subprocess.run([sys.executable, "-c", _CHILD, *urls], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    return json.loads(done.stdout)


def test_a_thread_that_reads_after_the_main_thread_returned_reads_every_sample(tmp_path):
    """It failed with "cannot schedule new futures after shutdown" from the decode pool."""
    passes = _passes("::".join(_shards(tmp_path)))
    assert passes["after"] == passes["before"] and len(passes["before"]) == 12  # (rank 0 of 2)


def test_over_http_too(tmp_path):
    """The pool that counts shards, and the event loop's executor (host names, the
    environment's proxy settings, looked up afresh for the second pass's host), are served too."""
    files = {os.path.basename(path): open(path, "rb").read() for path in _shards(tmp_path)}

    async def handle(request):
        return web.Response(body=files[request.match_info["path"]])

    runner, url = serve_app(handle)
    try:
        origin = url.rsplit("/", 1)[0]  # (the second pass names another host: a lookup of its own)
        passes = _passes(*("::".join(f"{host}/{name}" for name in files)
                           for host in (origin, origin.replace("127.0.0.1", "localhost"))))
    finally:
        run_coroutine(runner.cleanup()).result(5)
    assert passes["after"] == passes["before"] and len(passes["before"]) == 12  # (rank 0 of 2)


def test_the_pool_is_a_thread_pool_executor_of_daemon_threads():
    pool = WorkerPool(2, "test-workers")
    try:
        assert isinstance(pool, ThreadPoolExecutor)  # (what asyncio's set_default_executor takes)
        names = set(pool.map(lambda _: (threading.current_thread().name, threading.current_thread().daemon),
                             range(50)))
        assert {daemon for _, daemon in names} == {True}
        assert {name for name, _ in names} <= {"test-workers_0", "test-workers_1"}
        with pytest.raises(ZeroDivisionError):
            pool.submit(lambda: 1 / 0).result(5)
    finally:
        pool.shutdown()
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(print)


def test_shutdown_cancels_queued_work_when_asked():
    pool = WorkerPool(1, "test-workers")
    gate = threading.Event()
    running = pool.submit(gate.wait, 5)
    queued = [pool.submit(time.sleep, 0) for _ in range(3)]
    pool.shutdown(wait=False, cancel_futures=True)
    gate.set()
    assert running.result(5) is True
    for future in queued:
        with pytest.raises(CancelledError):
            future.result(5)


def test_idle_threads_are_reused_not_added():
    pool = WorkerPool(8, "test-workers")
    try:
        for _ in range(20):
            pool.submit(time.sleep, 0).result(5)
        assert len(pool._workers) == 1
    finally:
        pool.shutdown()


@pytest.mark.parametrize("in_a_cycle", [False, True])
def test_a_pool_dropped_without_shutdown_lets_its_threads_go(in_a_cycle):
    pool = WorkerPool(2, "test-dropped")
    if in_a_cycle:  # (collected by the garbage collector, not by its reference count)
        pool.itself = pool
    assert list(pool.map(abs, [-1, -2, -3])) == [1, 2, 3]
    threads = list(pool._workers)
    del pool
    gc.collect()
    for thread in threads:
        thread.join(5)
    assert not any(thread.is_alive() for thread in threads)


_DAEMON_CHILD = r"""
import sys, threading, time
import shardstream as wds

def read():
    for _ in wds.WebDataset(sys.argv[1], shardshuffle=False):
        pass

threading.Thread(target=read, daemon=True).start()
time.sleep(0.5)
print("main returns", flush=True)
"""


def test_a_daemon_thread_reading_at_exit_ends_without_a_traceback():
    """The loop is shut down at exit, after the non-daemon threads have ended: a daemon thread
    still reading then got "fetch cancelled (event loop shut down)", and threading printed its
    traceback at the end of a run that went well (webdataset exits silently)."""
    async def drip(request):
        response = web.StreamResponse(headers={"Content-Length": str(1 << 20)})
        await response.prepare(request)
        for _ in range(200):  # (bounded: 20 s at most)
            await response.write(b"\0" * 512)
            await asyncio.sleep(0.1)
        return response

    runner, url = serve_app(drip)
    try:
        done = subprocess.run([sys.executable, "-c", _DAEMON_CHILD, url.replace("x.bin", "slow.tar")],
                              capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=ROOT))
    finally:
        run_coroutine(runner.cleanup()).result(5)
    assert done.returncode == 0 and done.stdout == "main returns\n"
    assert "Traceback" not in done.stderr and "Exception in thread" not in done.stderr, done.stderr
