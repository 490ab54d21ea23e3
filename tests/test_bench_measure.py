"""benchmarks/measure.py: the memory a pass is handed is memory the machine has touched (`HeldMemory`
gives it back as the pass takes memory), and the holder stays out of the pass's CPU and PSS."""

from __future__ import annotations

import importlib.util
import os
import sys
import time

import pytest

psutil = pytest.importorskip("psutil")

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/meminfo"), reason="HeldMemory reads /proc/meminfo (Linux)")


@pytest.fixture(scope="module")
def measure():
    # loaded from their files under the names measure.py imports: putting benchmarks/ on sys.path
    # would let its modules (raw, decode, report, ...) shadow others for the rest of the session
    loaded = []
    try:
        for name in ("harness", "measure"):
            spec = importlib.util.spec_from_file_location(name, os.path.join(BENCH, f"{name}.py"))
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            loaded.append(name)
            spec.loader.exec_module(module)
        yield module
    finally:
        for name in loaded:
            sys.modules.pop(name, None)


def held_size(pid: int) -> int:
    """The size of the holder's scratch file (deleted, open in the holder)."""
    for fd in os.listdir(f"/proc/{pid}/fd"):
        link = os.readlink(f"/proc/{pid}/fd/{fd}")
        if "shardstream-bench-held-" in link:
            return os.stat(f"/proc/{pid}/fd/{fd}").st_size
    raise AssertionError(f"process {pid} holds no scratch file")


def test_held_memory_is_handed_back_as_the_pass_takes_memory_and_freed_at_the_end(measure):
    if measure._mem_free() < (1 << 30):
        pytest.skip("less than 1 GiB of free memory")
    held = measure.HeldMemory(256 << 20)
    try:
        assert held.pid is not None
        assert held_size(held.pid) == 256 << 20  # held before the clock starts
        base_pss = measure.tree_pss(psutil.Process(), held.pid)
        assert measure.tree_pss(psutil.Process()) > base_pss  # the holder's own memory is left out
        held.start()
        time.sleep(0.1)
        ahead = held_size(held.pid)
        assert (256 << 20) - ahead <= 128 << 20  # a little ahead of the pass, not all at once
        taken = bytearray(os.urandom(1 << 20)) * 160  # 160 MiB, every page touched
        deadline = time.monotonic() + 5.0
        while held_size(held.pid) > ahead - (128 << 20) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert held_size(held.pid) <= ahead - (128 << 20)
        del taken
        pid = held.pid
    finally:
        held.stop()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_nothing_is_held_when_asked_for_nothing(measure):
    held = measure.HeldMemory(0)
    assert held.pid is None
    held.start()
    held.stop()
