"""The shared event loop: one per process, on a daemon thread, replaced after fork, closed at exit."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))

from shardserver import ShardServer  # noqa: E402

from shardstream._fetch import loop as _loop  # noqa: E402
from shardstream._base.errors import FetchError  # noqa: E402
from shardstream._fetch.stream import open_stream  # noqa: E402
from shardstream._fetch.options import FetchOptions

pytestmark = pytest.mark.timeout(30)

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("loop-served")
    data = os.urandom(3 << 20)
    (root / "blob.bin").write_bytes(data)
    (root / "small.bin").write_bytes(data[:1000])
    with ShardServer(root) as server:
        yield server, data


def test_one_loop_on_a_daemon_thread():
    loop = _loop.get_loop()
    assert _loop.get_loop() is loop
    thread_ids = _loop.run_coroutine(_thread_ident()).result(5)
    loop_thread = [t for t in threading.enumerate() if t.ident == thread_ids]
    assert loop_thread and loop_thread[0].daemon and loop_thread[0].name == "shardstream-loop"
    assert thread_ids != threading.get_ident()


async def _thread_ident() -> int:
    return threading.get_ident()


def test_run_coroutine_returns_results_and_raises():
    async def add(a, b):
        await asyncio.sleep(0)
        return a + b

    async def boom():
        raise KeyError("inside")

    assert _loop.run_coroutine(add(2, 3)).result(5) == 5
    with pytest.raises(KeyError, match="inside"):
        _loop.run_coroutine(boom()).result(5)


def test_one_session_per_loop_and_shutdown_closes_it():
    hook_ran = []

    async def hook():
        hook_ran.append(asyncio.get_running_loop().is_running())

    _loop.add_shutdown_hook(hook)
    session = _loop.run_coroutine(_loop.get_session()).result(5)
    assert _loop.run_coroutine(_loop.get_session()).result(5) is session
    assert session.connector.limit == 0  # no cap: the readers bound the connections (see CONNECTION_LIMIT)
    old_loop = _loop.get_loop()
    _loop.shutdown_loop()
    assert session.closed and old_loop.is_closed() and hook_ran == [True]
    _loop._shutdown_hooks.remove(hook)
    assert not any(t.name == "shardstream-loop" and t.is_alive() for t in threading.enumerate())
    # The next use starts a new loop with a new session.
    new_session = _loop.run_coroutine(_loop.get_session()).result(5)
    assert _loop.get_loop() is not old_loop and new_session is not session


def test_shutdown_cancels_running_streams(served):
    server, data = served
    server.options.bandwidth = 1e6  # slow enough to still be running at shutdown
    try:
        stream = open_stream(server.url("blob.bin"), options=FetchOptions(chunk_size=64 << 10))
        assert next(stream)
        started = time.monotonic()
        _loop.shutdown_loop()
        assert time.monotonic() - started < 3
        with pytest.raises(FetchError, match="cancelled"):
            for _ in stream:
                pass
        stream.close()
    finally:
        server.options.bandwidth = None


def test_session_on_a_loop_of_your_own():
    async def main():
        session = await _loop.get_session()
        assert session is await _loop.get_session()
        await _loop.close_session()
        assert session.closed

    asyncio.run(main())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_loop_survives_fork(served):
    server, data = served
    url = server.url("blob.bin")
    assert b"".join(open_stream(url)) == data  # the parent's loop and session are in use
    parent_loop = _loop.get_loop()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            os.close(read_fd)
            ok = _loop.get_loop() is not parent_loop and b"".join(open_stream(url)) == data
            os.write(write_fd, b"ok" if ok else b"mismatch")
            code = 0
        except BaseException as exc:  # noqa: BLE001
            os.write(write_fd, repr(exc).encode()[:500])
        finally:
            os._exit(code)
    os.close(write_fd)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.02)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung")
    with os.fdopen(read_fd, "rb") as pipe:
        said = pipe.read()
    assert said == b"ok" and os.waitstatus_to_exitcode(status) == 0
    # The parent's loop and pooled connections still work after the child used its own.
    assert _loop.get_loop() is parent_loop
    assert b"".join(open_stream(url)) == data


@pytest.mark.parametrize("uvloop_env", ["1", "0"], ids=["uvloop-if-installed", "asyncio"])
def test_exit_closes_sessions_without_warnings(served, uvloop_env):
    """An interpreter that exits with a stream mid-download and an idle pooled connection says
    nothing about unclosed sessions, connectors or destroyed tasks, on either event loop."""
    server, _ = served
    server.options.bandwidth = 2e6
    try:
        script = textwrap.dedent(
            f"""
            import atexit
            seen = {{}}
            # atexit runs handlers last-in first-out: this one runs after shardstream's.
            atexit.register(lambda: print("CLOSED", seen["session"].closed, seen["loop"].is_closed()))
            from shardstream._fetch import loop as _loop
            from shardstream._fetch.stream import open_stream
            url = {server.url("blob.bin")!r}
            done = open_stream({server.url("small.bin")!r})
            assert sum(map(len, done)) == 1000
            running = open_stream(url)
            next(running)
            seen["session"] = _loop.run_coroutine(_loop.get_session()).result(5)
            seen["loop"] = _loop.get_loop()
            print("LOOP", type(seen["loop"]).__module__)
            print("EXITING", flush=True)
            """
        )
        proc = subprocess.run(
            [sys.executable, "-W", "always::ResourceWarning", "-c", script],
            cwd=REPO, capture_output=True, text=True, timeout=25,
            env={**os.environ, "SHARDSTREAM_UVLOOP": uvloop_env},
        )
    finally:
        server.options.bandwidth = None
    assert proc.returncode == 0, proc.stderr
    assert "EXITING" in proc.stdout and "CLOSED True True" in proc.stdout
    expected = "uvloop" if uvloop_env == "1" and _uvloop_installed() else "asyncio.unix_events"
    assert f"LOOP {expected}" in proc.stdout, proc.stdout
    for noise in ("Unclosed", "unclosed", "Task was destroyed", "Exception ignored", "Traceback"):
        assert noise not in proc.stderr, proc.stderr


def _uvloop_installed() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def test_the_shared_loop_is_uvloop_when_it_is_installed(served):
    """With the `fast` extra the streams run on uvloop (the default, SHARDSTREAM_UVLOOP unset)."""
    uvloop = pytest.importorskip("uvloop")
    if os.environ.get("SHARDSTREAM_UVLOOP") == "0":
        pytest.skip("SHARDSTREAM_UVLOOP=0 in this environment")
    server, data = served
    assert isinstance(_loop.get_loop(), uvloop.Loop)
    assert b"".join(open_stream(server.url("blob.bin"))) == data
