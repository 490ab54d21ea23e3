"""Helpers shared by the fetch tests: the shared loop's tasks, waiting for a condition, files to
serve, and reading a URL whole."""

from __future__ import annotations

import asyncio
import random
import time

from aiohttp import web

from shardstream._fetch.stream import open_stream
from shardstream._fetch.loop import run_coroutine


def loop_tasks():
    """The tasks on the shared loop (other than the one asking, and the stall watchdog, which
    comes and goes with the transfers it watches and restarts to look more often)."""

    async def others():
        return {t for t in asyncio.all_tasks()
                if t is not asyncio.current_task() and t.get_coro().__qualname__ != "_watch"}

    return run_coroutine(others()).result(5)


def wait_for(predicate, timeout=3.0):
    """Poll `predicate` until true (True) or until `timeout` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def read_stream(url, options, **kwargs):
    """All the bytes of `url` through a ChunkStream, and that stream's stats."""
    with open_stream(url, options=options, **kwargs) as stream:
        return b"".join(stream), stream.stats.snapshot()


def write_files(root, sizes, seed=0):
    """Write random files {name: size} under `root` (seeded); returns (root, {name: bytes})."""
    contents = {}
    for offset, (name, size) in enumerate(sizes.items()):
        contents[name] = random.Random(seed + offset).randbytes(size)
        (root / name).write_bytes(contents[name])
    return root, contents


def reader(default_options):
    """fetch_all(url, options=default_options, **kwargs) -> (bytes, stats), via read_stream."""

    def fetch_all(url, options=default_options, **kwargs):
        return read_stream(url, options, **kwargs)

    return fetch_all


def serve_app(handle):
    """An aiohttp app answering every GET with `handle`, on the shared loop (for servers that
    misbehave in ways shardserver does not): (runner, URL of /x.bin). Clean up with runner.cleanup()."""

    async def start():
        app = web.Application()
        app.router.add_get("/{path:.*}", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return runner, f"http://127.0.0.1:{runner.addresses[0][1]}/x.bin"

    return run_coroutine(start()).result(5)
