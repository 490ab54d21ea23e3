"""Child process: time the passes of one configuration and write the figures as JSON.

Run by `harness.run_config` as `python measure.py SPEC.json RESULT.json`, in a fresh interpreter per
configuration, so imports, memory and caches of one configuration never touch another.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import resource
import select
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from typing import Collection, Optional

import psutil

from harness import Config, Rep

__all__ = ["HeldMemory", "PssSampler", "process_tree_cpu", "timed_pass", "warm_page_cache"]


def warm_page_cache(paths: list[str], chunk: int = 1 << 20) -> None:
    """Read every file once, so that all configurations start with the shards in the page cache."""
    for path in paths:
        with open(path, "rb", buffering=0) as stream:
            while stream.read(chunk):
                pass


def _mem_free() -> int:
    """MemFree of /proc/meminfo, in bytes (0 where there is none: not Linux)."""
    try:
        with open("/proc/meminfo", "rb") as stream:
            for line in stream:
                if line.startswith(b"MemFree:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class HeldMemory:
    """Hold `nbytes` of memory this machine has touched, in a scratch file's page cache, and hand
    it back to the kernel as the pass takes memory, a few MiB ahead of it.

    This project's Firecracker machines back guest memory only when the guest touches it, and their
    balloon driver hands free pages back to the host (free page reporting) about 2 s after they are
    freed. Writing 485 MB into the page cache measured 0.035-0.07 s of system time in pages the
    guest held, and 0.5-0.9 s in pages it had handed back. A training node's memory is its own (or
    full of page cache it reclaims cheaply), so without this the configurations that take memory (a
    cold disk cache writes the corpus into the page cache; every loader grows its heap) would pay a
    cost no training node pays, unevenly.

    Writing and deleting a scratch file just before the pass (what this did before) raced the
    balloon: where its reporting ran during the pass, the pages were gone again (in one process of
    three, the cache writer's writes took 0.89 s of system time against 0.035-0.07 s). Handed back
    as the pass takes memory, a page is reused within milliseconds of being freed.

    The holder is a child process (`python measure.py --hold N`), so that its polling never asks
    for this process's GIL; `pid` names it, so that its CPU is left out of the pass's. The
    constructor returns once it holds the memory (untimed); `start()` lets it hand memory back,
    `stop()` frees the rest. It takes only free memory less 512 MiB, never the page cache (the
    warmed shards).
    """

    def __init__(self, nbytes: int) -> None:
        self.pid: Optional[int] = None
        self._proc = None
        nbytes = min(nbytes, max(0, _mem_free() - (512 << 20)))
        if nbytes <= 0:
            return
        self._proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--hold", str(nbytes)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        if self._proc.stdout.readline() != b"held\n":  # best effort: a full temp folder must not fail the measurement
            print("holding memory failed", file=sys.stderr)
            self.stop()
            return
        self.pid = self._proc.pid

    def start(self) -> None:
        if self._proc is not None:
            self._proc.stdin.write(b"go\n")
            self._proc.stdin.flush()

    def stop(self) -> None:
        """Free what is still held, and wait for the holder to exit. ("stop", not the pipe's end:
        DataLoader workers forked during the pass hold copies of its write end.)"""
        if self._proc is None:
            return
        proc, self._proc = self._proc, None
        try:
            proc.stdin.write(b"stop\n")
            proc.stdin.flush()
        except OSError:  # it is gone already
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for stream in (proc.stdin, proc.stdout):
            try:
                stream.close()
            except OSError:
                pass


def _hold(nbytes: int, ahead: int = 64 << 20, step: int = 16 << 20, interval: float = 0.005) -> None:
    """`HeldMemory`'s child: write `nbytes` to a deleted scratch file, say so, then on "go" shorten
    the file (freeing its pages) while MemFree falls, until "stop" (or its stdin's end)."""
    chunk = 1 << 20
    block = b"\0" * chunk
    # (a file, not a memfd: a memfd's pages came back reported to the host in 2 of 5 tries here)
    fd, path = tempfile.mkstemp(prefix="shardstream-bench-held-")
    # Its pages stay while fd is open. They are dirty: writeback would flush them after 30 s
    # (dirty_expire) or past the background threshold (10% of memory, ~2.3 GiB here), neither of
    # which a pass of a few seconds with at most ~1 GB held and the corpus cached reaches.
    os.unlink(path)
    held = 0
    while held < nbytes:
        held += os.write(fd, block)
    sys.stdout.buffer.write(b"held\n")
    sys.stdout.flush()
    if sys.stdin.buffer.readline() != b"go\n":
        return
    base, released = _mem_free(), 0
    while not select.select([sys.stdin], [], [], interval)[0]:
        taken = base + released - _mem_free()  # what the pass took since "go"
        if held > 0 and taken + ahead > released:
            size = min(held, max(step, taken + ahead - released))
            held -= size
            released += size
            os.ftruncate(fd, held)
    sys.stdin.buffer.readline()  # "stop" (or the end: the parent is gone)


def process_tree_cpu(exclude: Collection[int] = ()) -> float:
    """User+sys CPU seconds of this process, its reaped children, and its children still running
    but those in `exclude` (pids)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime
    for child in psutil.Process().children(recursive=True):
        if child.pid in exclude:
            continue
        try:
            times = child.cpu_times()
            total += times.user + times.system
        except psutil.Error:  # exited between listing and reading
            pass
    return total


def server_cpu(pid: Optional[int]) -> Optional[float]:
    """User+sys CPU seconds of the server process `pid` and its children (None: no server, or gone)."""
    if pid is None:
        return None
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return None
    return times.user + times.system + times.children_user + times.children_system


def tree_pss(process: psutil.Process, exclude: Collection[int] = ()) -> int:
    """PSS bytes of `process` and all its descendants but those in `exclude` (pids) (shared pages
    are split fairly between them)."""
    total = 0
    for proc in [process, *process.children(recursive=True)]:
        if proc.pid in exclude:
            continue
        try:
            total += proc.memory_full_info().pss
        except psutil.Error:
            pass
    return total


class PssSampler:
    """Sample the PSS of this process's tree (but `exclude`'s pids) every `interval` seconds and
    keep the peak, from a child process (`python measure.py --sample PID INTERVAL EXCLUDE`; `pid`
    names it, so that its CPU is left out of the pass's, as the holder's is).

    Not a thread of the measured process, as it was: each sample took 5.7 ms of CPU here (psutil
    reading smaps_rollup of a process with torch mapped), partly under the GIL, every 50 ms. That
    cost a one-process loader's first pass 10% (median of five fresh processes over HTTP: 1,684
    against 1,864 samples/s without it) and a DataLoader nothing, its main process waiting on its
    workers. The constructor returns once the first sample is taken (untimed); `stop()` takes a
    last one and sets `peak`."""

    def __init__(self, interval: float = 0.05, exclude: Collection[int] = ()) -> None:
        self.peak = 0
        self._proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--sample", str(os.getpid()), str(interval),
             ",".join(str(pid) for pid in exclude)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.pid = self._proc.pid
        if self._proc.stdout.readline() != b"ready\n":
            self._proc.kill()
            self._proc.wait()
            raise RuntimeError("the PSS sampler did not start")

    def stop(self) -> None:
        """Take a last sample, read the peak, and wait for the sampler to exit."""
        proc = self._proc
        try:
            proc.stdin.write(b"stop\n")
            proc.stdin.flush()
            self.peak = int(proc.stdout.readline() or 0)
        finally:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            proc.stdin.close()
            proc.stdout.close()


def _sample(pid: int, interval: float, exclude: Collection[int]) -> None:
    """`PssSampler`'s child: sample the tree of `pid` (but itself and `exclude`) until "stop"."""
    process, skip = psutil.Process(pid), {*exclude, os.getpid()}
    peak = tree_pss(process, skip)
    sys.stdout.buffer.write(b"ready\n")
    sys.stdout.flush()
    while not select.select([sys.stdin], [], [], interval)[0]:
        peak = max(peak, tree_pss(process, skip))
    sys.stdin.buffer.readline()  # "stop" (or the end: the parent is gone)
    peak = max(peak, tree_pss(process, skip))
    sys.stdout.buffer.write(b"%d\n" % peak)
    sys.stdout.flush()


def timed_pass(start_pass, count, hold: int = 0, server_pid: Optional[int] = None) -> tuple[Rep, Optional[str]]:
    """Run one pass; `start_pass()` returns the iterable, `count(item)` its (samples, bytes).
    `hold` bytes of touched memory are handed back to the kernel as the pass takes memory
    (`HeldMemory`); the CPU of the server process `server_pid` is measured beside the pass's.

    Returns the figures, and shardstream's `stats().format()` of the pass when the iterator has one
    (read after the clock stops; a DataLoader's iterator has none).
    """
    prepare = getattr(start_pass, "prepare", None)
    if prepare is not None:
        prepare()
    held = HeldMemory(hold)
    sampler: Optional[PssSampler] = None
    try:
        gc.collect()
        holder = () if held.pid is None else (held.pid,)
        base_pss = tree_pss(psutil.Process(), holder)  # the process before the pass: interpreter, torch, the library
        sampler = PssSampler(exclude=holder)
        helpers = (*holder, sampler.pid)  # (left out of the pass's CPU)
        held.start()
        cpu_start, server_start = process_tree_cpu(exclude=helpers), server_cpu(server_pid)
        started = time.perf_counter()
        first = None
        samples = nbytes = 0
        item = None
        iterator = iter(start_pass())
        for item in iterator:
            if first is None:
                first = time.perf_counter() - started
            n, b = count(item)
            samples += n
            nbytes += b
        stats = getattr(iterator, "stats", None)  # shardstream's engine iterator; its threads are done
        del iterator, item  # lets DataLoader workers exit before the clock stops
        wall = time.perf_counter() - started
        cpu, server_end = process_tree_cpu(exclude=helpers) - cpu_start, server_cpu(server_pid)
    finally:  # (a failed pass too: the holder must not keep its memory while the error is reported)
        held.stop()
        if sampler is not None:
            sampler.stop()
    assert sampler is not None
    text = None
    if callable(stats):
        pipeline_stats = stats()
        text = pipeline_stats.format() if pipeline_stats is not None else None
    rep = Rep(samples=samples, bytes=nbytes, wall_s=wall, first_s=first if first is not None else wall,
              cpu_s=max(0.0, cpu), peak_pss_mb=sampler.peak / 2**20,
              base_pss_mb=base_pss / 2**20,
              server_cpu_s=None if server_start is None or server_end is None else server_end - server_start)
    return rep, text


def main(spec_path: str, result_path: str) -> None:
    """Read the spec, warm the page cache, set the workload up, time the repetitions, write JSON."""
    with open(spec_path) as stream:
        spec = json.load(stream)
    config = Config(**spec["config"])
    warm = spec.get("warm", spec["urls"])
    warm_page_cache(warm)  # remote sources: the files the server reads
    corpus_bytes = sum(os.path.getsize(path) for path in warm)
    # torch on both sides, as in a training job (a DataLoader needs it; our loader does not, but
    # the process it feeds has it): memory columns compare like with like.
    importlib.import_module("torch")
    workload = importlib.import_module(config.module_name)
    started = time.perf_counter()
    start_pass = workload.make_pass(config, spec["urls"])
    setup = time.perf_counter() - started
    reps, stats = [], None
    try:
        for _ in range(spec["repeat"]):
            rep, stats = timed_pass(start_pass, workload.count, hold=corpus_bytes + (512 << 20),
                                    server_pid=spec.get("server_pid"))
            reps.append(rep)
    finally:
        close = getattr(start_pass, "close", None)
        if close is not None:
            close()
    with open(result_path + ".tmp", "w") as stream:
        json.dump({"setup_s": setup, "reps": [asdict(r) for r in reps], "stats": stats}, stream)
    os.replace(result_path + ".tmp", result_path)


if __name__ == "__main__":
    if sys.argv[1] == "--hold":
        _hold(int(sys.argv[2]))
    elif sys.argv[1] == "--sample":
        _sample(int(sys.argv[2]), float(sys.argv[3]), [int(pid) for pid in sys.argv[4].split(",") if pid])
    else:
        main(*sys.argv[1:3])
