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
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from typing import Optional

import psutil

from harness import Config, Rep

__all__ = ["PssSampler", "process_tree_cpu", "recycle_free_memory", "timed_pass", "warm_page_cache"]


def warm_page_cache(paths: list[str], chunk: int = 1 << 20) -> None:
    """Read every file once, so that all configurations start with the shards in the page cache."""
    for path in paths:
        with open(path, "rb", buffering=0) as stream:
            while stream.read(chunk):
                pass


def recycle_free_memory(nbytes: int, chunk: int = 1 << 20) -> None:
    """Write `nbytes` to a scratch file in the temp folder and delete it, so that the kernel's free
    list holds that much memory this machine has used a moment ago. Capped at the free memory less
    512 MiB: it takes only free pages, never the page cache (the warmed shards).

    This project's Firecracker machines back guest memory only when the guest touches it, and their
    balloon driver reports free pages back to the host (free page reporting) about 2 s after they
    are freed: writing 485 MB into the page cache then costs ~0.5 s of system time, against ~0.1 s
    in pages freed less than a second before. A training node's memory is its own (or full of page
    cache it reclaims cheaply), so without this step the configuration that grows the page cache (a
    cold disk cache writing the corpus) would pay a cost no training node pays, and the others would
    not. `timed_pass` calls it just before the clock starts, in every configuration alike.
    """
    nbytes = min(nbytes, max(0, psutil.virtual_memory().free - (512 << 20)))
    if nbytes <= 0:
        return
    block = b"\0" * chunk
    # (a file, not a memfd: a memfd's pages came back reported to the host in 2 of 5 tries here)
    try:
        fd, path = tempfile.mkstemp(prefix="shardstream-bench-recycle-")
        try:
            written = 0
            while written < nbytes:
                written += os.write(fd, block)
        finally:
            os.close(fd)
            os.unlink(path)  # dirty pages of a deleted file are dropped, not written back (below the dirty limits)
    except OSError as exn:  # best effort: a full temp folder must not fail the measurement
        print(f"recycling free memory failed: {exn}", file=sys.stderr)


def process_tree_cpu() -> float:
    """User+sys CPU seconds of this process, its reaped children, and its children still running."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
            total += times.user + times.system
        except psutil.Error:  # exited between listing and reading
            pass
    return total


def tree_pss(process: psutil.Process) -> int:
    """PSS bytes of `process` and all its descendants (shared pages are split fairly between them)."""
    total = 0
    for proc in [process, *process.children(recursive=True)]:
        try:
            total += proc.memory_full_info().pss
        except psutil.Error:
            pass
    return total


class PssSampler(threading.Thread):
    """Sample the process tree's PSS every `interval` seconds; keep the peak and the thread's own CPU."""

    def __init__(self, interval: float = 0.05) -> None:
        super().__init__(name="pss-sampler", daemon=True)
        self.interval = interval
        self.peak = 0
        self.own_cpu_s = 0.0
        self._stop_event = threading.Event()
        self._process = psutil.Process()

    def run(self) -> None:
        while True:
            self.peak = max(self.peak, tree_pss(self._process))
            if self._stop_event.wait(self.interval):
                break
        self.own_cpu_s = time.thread_time()

    def stop(self) -> None:
        """Stop sampling and wait for the thread to end."""
        self._stop_event.set()
        self.join()


def timed_pass(start_pass, count, recycle: int = 0) -> tuple[Rep, Optional[str]]:
    """Run one pass; `start_pass()` returns the iterable, `count(item)` its (samples, bytes).
    `recycle` bytes of free memory are recycled just before it (`recycle_free_memory`).

    Returns the figures, and shardstream's `stats().format()` of the pass when the iterator has one
    (read after the clock stops; a DataLoader's iterator has none).
    """
    prepare = getattr(start_pass, "prepare", None)
    if prepare is not None:
        prepare()
    recycle_free_memory(recycle)
    gc.collect()
    base_pss = tree_pss(psutil.Process())  # the process before the pass: interpreter, torch, the library
    sampler = PssSampler()
    sampler.start()
    cpu_start = process_tree_cpu()
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
    cpu = process_tree_cpu() - cpu_start
    sampler.stop()
    text = None
    if callable(stats):
        pipeline_stats = stats()
        text = pipeline_stats.format() if pipeline_stats is not None else None
    rep = Rep(samples=samples, bytes=nbytes, wall_s=wall, first_s=first if first is not None else wall,
              cpu_s=max(0.0, cpu - sampler.own_cpu_s), peak_pss_mb=sampler.peak / 2**20,
              base_pss_mb=base_pss / 2**20)
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
            rep, stats = timed_pass(start_pass, workload.count, recycle=corpus_bytes)
            reps.append(rep)
    finally:
        close = getattr(start_pass, "close", None)
        if close is not None:
            close()
    with open(result_path + ".tmp", "w") as stream:
        json.dump({"setup_s": setup, "reps": [asdict(r) for r in reps], "stats": stats}, stream)
    os.replace(result_path + ".tmp", result_path)


if __name__ == "__main__":
    main(*sys.argv[1:3])
