"""benchmarks/measure.py: the memory a pass is handed is memory the machine has touched (`HeldMemory`
gives it back as the pass takes memory), and the holder and the PSS sampler stay out of the pass's
CPU and PSS."""

from __future__ import annotations

import importlib.util
import os
import subprocess
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
    if psutil.virtual_memory().available < (2 << 30):
        pytest.skip("less than 2 GiB of memory available")
    mib = 1 << 20
    held = measure.HeldMemory(384 * mib)
    try:
        assert held.pid is not None
        assert held_size(held.pid) == 384 * mib  # held before the clock starts
        base_pss = measure.tree_pss(psutil.Process(), (held.pid,))
        with_holder = measure.tree_pss(psutil.Process())
        assert with_holder - base_pss >= psutil.Process(held.pid).memory_full_info().pss // 2  # left out
        held.start()
        time.sleep(0.1)
        ahead = held_size(held.pid)
        # a little ahead of the pass (64 MiB and a step), not all at once (some slack: other processes)
        assert 384 * mib - ahead <= 192 * mib
        taken = [bytearray(os.urandom(mib)) * 256]  # 256 MiB, every page touched
        # The holder follows MemFree, which the whole machine moves: memory freed elsewhere meanwhile
        # (a process of an earlier test exiting) hides some of what this test took. Where the holder
        # lags for that reason, take up to 192 MiB more, a step a second (a holder that does not
        # follow at all still fails: it keeps what it holds).
        deadline, more = time.monotonic() + 8.0, time.monotonic() + 2.0
        while held_size(held.pid) > ahead - 96 * mib and time.monotonic() < deadline:
            time.sleep(0.02)
            if time.monotonic() > more and len(taken) < 4:
                taken.append(bytearray(os.urandom(mib)) * 64)
                more = time.monotonic() + 1.0
        # handed back as it was taken: most of it (this VM's MemFree lags and wanders by tens of MiB)
        assert held_size(held.pid) <= ahead - 96 * mib
        del taken
        pid = held.pid
    finally:
        held.stop()
    assert not psutil.pid_exists(pid)  # stopped and reaped


def test_nothing_is_held_when_asked_for_nothing(measure):
    held = measure.HeldMemory(0)
    assert held.pid is None
    held.start()
    held.stop()


def test_a_pass_measures_its_server_s_cpu_beside_its_own(measure):
    """The server process's CPU during the pass is measured (a server on the loader's machine takes
    CPU the loader does not get), and left out of the pass's own."""
    spin = "import time\nend = time.time() + 60\nwhile time.time() < end: pass"
    # not our child (as in the benchmark, where run.py starts the server): its shell exits at once
    started = subprocess.run(["sh", "-c", f'"{sys.executable}" -c "$0" >/dev/null 2>&1 & echo $!', spin],
                             capture_output=True, text=True, check=True)
    server = psutil.Process(int(started.stdout))
    try:
        time.sleep(0.2)

        def start_pass():  # the loader idles while the server spins (on a busy machine, a while)
            times = server.cpu_times()
            spent, deadline = times.user + times.system, time.monotonic() + 20
            while time.monotonic() < deadline:
                time.sleep(0.05)
                times = server.cpu_times()
                if times.user + times.system - spent >= 0.3:
                    break
            return range(10)

        rep, _ = measure.timed_pass(start_pass, lambda item: (1, 0), server_pid=server.pid)
        assert rep.server_cpu_s >= 0.3 and rep.cpu_s < 0.2
        rep, _ = measure.timed_pass(lambda: range(10), lambda item: (1, 0))
        assert rep.server_cpu_s is None  # local files: no server
    finally:
        server.kill()
        psutil.wait_procs([server], timeout=10)  # (not our child: a zombie under a lax init is fine)


def test_the_pss_sampler_samples_from_its_own_process_and_counts_only_the_pass(measure):
    """The peak includes memory the pass held for a moment; the sampler is a process of its own, whose
    polling takes no CPU (or GIL) of the pass and whose memory is not counted."""
    mib = 1 << 20
    base = measure.tree_pss(psutil.Process())
    sampler = measure.PssSampler(interval=0.005)
    try:
        assert sampler.pid != os.getpid() and psutil.Process(sampler.pid).ppid() == os.getpid()
        taken = bytearray(os.urandom(mib)) * 128  # 128 MiB, every page touched
        time.sleep(0.3)
        del taken
        cpu = measure.process_tree_cpu(exclude=(sampler.pid,))
        time.sleep(0.5)  # ~100 samples: a sampler in this process would take 0.1-0.6 s of its CPU
        idle_cpu = measure.process_tree_cpu(exclude=(sampler.pid,)) - cpu
    finally:
        sampler.stop()
    assert base + 120 * mib <= sampler.peak < base + 128 * mib + 64 * mib
    assert idle_cpu < 0.05
    assert not psutil.pid_exists(sampler.pid)
