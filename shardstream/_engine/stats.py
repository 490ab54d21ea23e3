"""Observability: per-stage task counts and times, queue waits and occupancy, source bytes/s,
and a verdict naming the stage that limits throughput.

Counters are updated from several threads; each object guards itself with a lock.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

__all__ = ["PipelineStats", "QueueStats", "StageStats"]

_RESERVOIR = 4096  # recent task times kept for percentiles
# A parallel stage that limits throughput while the process keeps fewer than this share of its
# threads' cores busy is bound by the GIL (its threads queue for it), not by the cores.
_GIL_BOUND = 0.6
# ... among at least this many (on fewer, one process's GIL is rarely the limit, and another
# process's load on the same cores would read as it).
_GIL_MIN_CORES = 4
# The source stage limits throughput because of its storage when its thread spent at least this
# share of its busy time waiting for bytes (`wait_us`, counted by the fetchers' streams).
_IO_BOUND = 0.5


class StageStats:
    """One stage: tasks run, failures, task times; busy time for the utilisation verdict."""

    def __init__(self, name: str, kind: str, workers: int = 1) -> None:
        self.name = name
        self.kind = kind  # "parallel" (thread pool) or "stream" (one thread, in order)
        self.workers = workers
        self._lock = threading.Lock()
        self.tasks = 0
        self.items = 0
        self.failures = 0
        self.busy_s = 0.0
        self._times: deque = deque(maxlen=_RESERVOIR)

    def record(self, seconds: float, items: int = 1, failures: int = 0) -> None:
        with self._lock:
            self.tasks += 1
            self.items += items
            self.failures += failures
            self.busy_s += seconds
            self._times.append(seconds / max(1, items))

    def add_busy(self, seconds: float, items: int = 0) -> None:
        with self._lock:
            self.busy_s += seconds
            self.items += items

    def per_item_s(self) -> Optional[float]:
        """Average busy time per item (read without the lock: a float read is atomic enough)."""
        items = self.items
        return self.busy_s / items if items else None

    def snapshot(self, wall_s: float) -> Dict[str, object]:
        with self._lock:
            times = sorted(self._times)
            n = len(times)
            avg = sum(times) / n if n else None
            p90 = times[min(n - 1, int(0.9 * n))] if n else None
            return {
                "name": self.name,
                "kind": self.kind,
                "workers": self.workers,
                "tasks": self.tasks,
                "items": self.items,
                "failures": self.failures,
                "avg_item_ms": None if avg is None else avg * 1e3,
                "p90_item_ms": None if p90 is None else p90 * 1e3,
                "busy_s": self.busy_s,
                "utilisation": self.busy_s / (wall_s * self.workers) if wall_s > 0 else 0.0,
            }


class QueueStats:
    """One bounded queue: how long producers waited (full) and consumers waited (empty)."""

    def __init__(self, name: str, capacity: int) -> None:
        self.name = name
        self.capacity = capacity
        self._lock = threading.Lock()
        self.puts = 0
        self.put_wait_s = 0.0
        self.get_wait_s = 0.0
        self._occupancy_sum = 0

    def on_put(self, size_after: int, waited: float) -> None:
        with self._lock:
            self.puts += 1
            self._occupancy_sum += size_after
            self.put_wait_s += waited

    def on_get(self, waited: float) -> None:
        if waited:
            with self._lock:
                self.get_wait_s += waited

    def snapshot(self) -> Dict[str, object]:
        with self._lock:
            return {
                "name": self.name,
                "capacity": self.capacity,
                "puts": self.puts,
                "avg_occupancy": self._occupancy_sum / self.puts if self.puts else 0.0,
                "put_wait_s": self.put_wait_s,
                "get_wait_s": self.get_wait_s,
            }


@dataclass
class PipelineStats:
    """Everything one engine run measured; `verdict()` names the limiting stage."""

    wall_s: float
    delivered: int
    stages: List[Dict[str, object]] = field(default_factory=list)
    queues: List[Dict[str, object]] = field(default_factory=list)
    source: Dict[str, int] = field(default_factory=dict)
    cache: Dict[str, Dict[str, int]] = field(default_factory=dict)
    consumer_wait_s: float = 0.0
    cpu_s: Optional[float] = None  # the process's CPU seconds over the run (every thread of it)
    cores: Optional[int] = None  # the cores the process may run on

    @property
    def cores_used(self) -> Optional[float]:
        """The process's CPU seconds per second of the run: how many cores it kept busy."""
        return self.cpu_s / self.wall_s if self.cpu_s is not None and self.wall_s > 0 else None

    @property
    def items_per_s(self) -> float:
        return self.delivered / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def source_bytes_per_s(self) -> float:
        return self.source.get("bytes", 0) / self.wall_s if self.wall_s > 0 else 0.0

    def verdict(self) -> str:
        """One line: which stage limits throughput, judged by utilisation and queue waits."""
        if not self.stages or self.wall_s <= 0:
            return "no data yet"
        consumer_busy = max(0.0, 1.0 - self.consumer_wait_s / self.wall_s)
        busiest: Dict[str, Any] = max(self.stages, key=lambda s: float(s["utilisation"]))
        if consumer_busy > 0.8 and consumer_busy > busiest["utilisation"]:
            return (
                f"the consumer (training loop) limits throughput: it is busy {consumer_busy:.0%} of the time "
                "and the loader keeps its queue full"
            )
        workers = int(busiest["workers"])  # type: ignore[call-overload]
        what = f"its {workers} threads are" if workers != 1 else "its thread is"
        line = f"stage '{busiest['name']}' limits throughput: {what} busy {busiest['utilisation']:.0%} of the time"
        waited = self.source.get("wait_us", 0) / 1e6  # (the source's waits; its segment is stages[0])
        if waited and busiest is self.stages[0] and waited >= _IO_BOUND * float(busiest["busy_s"]):  # type: ignore[arg-type]
            return line + (
                f", {waited / self.wall_s:.0%} of the run waiting for shard bytes that had not arrived: "
                "storage or the network limits this pass, not the CPU"
            )
        used = self.cores_used
        if busiest["kind"] == "parallel" and self.cores and min(workers, self.cores) >= _GIL_MIN_CORES \
                and used is not None and used < _GIL_BOUND * min(workers, self.cores):
            line += (
                f", yet the process kept only {used:.1f} of its {self.cores} cores busy: the stage's Python code "
                "holds the GIL (or it waits on I/O), so more threads will not help; more processes will "
                "(WebLoader(dataset, num_workers=N) runs N processes, each with threads)"
            )
        return line

    def as_dict(self) -> Dict[str, object]:
        return {
            "wall_s": self.wall_s,
            "delivered": self.delivered,
            "items_per_s": self.items_per_s,
            "source_bytes_per_s": self.source_bytes_per_s,
            "consumer_wait_s": self.consumer_wait_s,
            "cpu_s": self.cpu_s,
            "cores": self.cores,
            "stages": self.stages,
            "queues": self.queues,
            "source": self.source,
            "cache": self.cache,
            "verdict": self.verdict(),
        }

    def format(self) -> str:
        """A small table for humans."""
        lines = [
            f"{self.delivered} items in {self.wall_s:.2f}s = {self.items_per_s:.1f}/s; "
            f"source {self.source_bytes_per_s / 1e6:.1f} MB/s"
            + ("" if self.cores_used is None else f"; process CPU {self.cores_used:.1f} of {self.cores} cores"),
            f"{'stage':<34}{'kind':<10}{'items':>8}{'fail':>6}{'avg ms':>9}{'p90 ms':>9}{'util':>7}",
        ]
        for s in self.stages:
            avg = "-" if s["avg_item_ms"] is None else f"{s['avg_item_ms']:.3f}"
            p90 = "-" if s["p90_item_ms"] is None else f"{s['p90_item_ms']:.3f}"
            lines.append(
                f"{str(s['name'])[:33]:<34}{s['kind']:<10}{s['items']:>8}{s['failures']:>6}{avg:>9}{p90:>9}"
                f"{s['utilisation']:>7.0%}"
            )
        for q in self.queues:
            lines.append(
                f"queue {q['name']}: avg occupancy {q['avg_occupancy']:.1f}/{q['capacity']}, "
                f"producer waited {q['put_wait_s']:.2f}s, consumer waited {q['get_wait_s']:.2f}s"
            )
        if self.source:
            lines.append("source: " + _source_line(self.source))
        for tier, counts in self.cache.items():
            shown = ", ".join(f"{k} {v}" for k, v in counts.items() if v)
            lines.append(f"cache {tier}: {shown or 'idle'}")
        lines.append("verdict: " + self.verdict())
        return "\n".join(lines)


_WORDS = {"shards": "shard", "samples": "sample", "retries": "retry", "resumes": "resume", "errors": "error"}


def _counted(source: Dict[str, int], field: str) -> str:
    n = source.get(field, 0)
    return f"{n:,} {field if n != 1 else _WORDS[field]}"


def _source_line(source: Dict[str, int]) -> str:
    """What the source stage read, and what reading it took: "16 shards, 4,000 samples, 485.3 MB;
    2 retries, 1 resume, 0 errors; waited 1.21s for bytes" (the last only over a network)."""
    read = [_counted(source, "shards"), _counted(source, "samples"), f"{source.get('bytes', 0) / 1e6:,.1f} MB"]
    line = ", ".join(read) + "; " + ", ".join(_counted(source, f) for f in ("retries", "resumes", "errors"))
    if source.get("wait_us"):
        line += f"; waited {source['wait_us'] / 1e6:.2f}s for bytes"
    return line


def now() -> float:
    return time.perf_counter()
