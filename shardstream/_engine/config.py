"""Engine configuration: a frozen, validated dataclass, process-wide defaults and env vars.

SHARDSTREAM_THREADS sets the default decode-pool size; SHARDSTREAM_ENGINE=0 turns the engine off
(pipelines then run as plain nested generators, exactly like webdataset).
"""

from __future__ import annotations

import dataclasses
import numbers
import os
import threading
from dataclasses import dataclass
from typing import Any, Optional

from .._base.lazytorch import worker_info

__all__ = ["MAX_DEFAULT_THREADS", "EngineConfig", "available_cores", "engine_defaults", "set_engine_defaults"]

# The most decode threads one process gets by default. Past a few cores the GIL, not the cores,
# bounds a pipeline with Python in its per-sample work (Pillow's decode and a crop hold it for
# part of each image), and more threads only queue for it. Decode pipeline (Pillow, center crop,
# batches of 64) on a 16-core machine, one fresh process each: 2 threads 649 samples/s, 4: 1,126,
# 6: 1,494, 8: 1,411, 12: 1,304, 17 (cores + 1): 1,013, while the process used 4.2 cores at most
# (a second sweep, on another machine: 6: 1,199, 8: 1,258, 17: 1,070). Processes scale on:
# WebLoader(num_workers=4) ran at 2,781-3,079, and 8 at 2,986-3,185. `threads=` or SHARDSTREAM_THREADS
# sets more, for stages that hold the GIL less (simplejpeg, PyAV, the fused image path).
MAX_DEFAULT_THREADS = 8


@dataclass(frozen=True)
class EngineConfig:
    """How a pipeline runs on the engine.

    Args:
        enabled: run on the engine (False: nested generators in the caller's thread).
        threads: decode-pool threads; None derives it from the cores available to this process
            (cores + 1, at most `MAX_DEFAULT_THREADS`), or their share per DataLoader worker inside
            a worker (at most the same).
        ordered: deliver in the same order as a sequential run (False: as tasks finish; faster
            when task times vary).
        max_inflight: pool tasks in flight per parallel stage; None: 2 x threads.
        queue_chunks: capacity of each queue between stages, in chunks of items.
        queue_bytes: and in bytes of the items queued beyond one chunk (arrays, tensors, bytes,
            strings, estimated from each chunk's first item): large batches wait a few at a time.
        max_chunk: most samples per pool task / queue chunk (chunks adapt below it).
        log_interval: seconds between periodic stats log lines (None: no log).
    """

    enabled: bool = True
    threads: Optional[int] = None
    ordered: bool = True
    max_inflight: Optional[int] = None
    queue_chunks: int = 8
    queue_bytes: int = 64 << 20
    max_chunk: int = 32
    log_interval: Optional[float] = None

    def __post_init__(self) -> None:
        for name in ("threads", "max_inflight", "queue_chunks", "queue_bytes", "max_chunk"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1):
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        for name in ("enabled", "ordered"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.log_interval is not None and self.log_interval <= 0:
            raise ValueError("log_interval must be positive")

    def replace(self, **changes: Any) -> "EngineConfig":
        return dataclasses.replace(self, **changes)

    def resolved_threads(self) -> int:
        """The pool size to use here and now (inside a DataLoader worker: a share of the cores)."""
        if self.threads is not None:
            return self.threads
        share = _worker_share()
        if share is not None:
            return max(1, min(share, MAX_DEFAULT_THREADS))
        # One more thread than cores: while a thread holds the GIL for the Python parts of a
        # decode (PIL's per-tile loop, the crop), another one's C code keeps the core busy.
        return min(available_cores() + 1, MAX_DEFAULT_THREADS)

    def crowded_worker(self) -> bool:
        """Whether this is a DataLoader worker with a core or less to itself (and `threads` is not
        set): the worker processes are then the parallelism, and the engine's threads (source,
        one decode thread, the stages after it) would only add hand-offs. Measured on 2 cores,
        decode pipeline, without them: 4 workers ran at 781-782 against 672-723 samples/s, with
        5-13% less CPU per sample and 70-90 MB less; 2 workers at the same speed, ~30 MB less."""
        if self.threads is not None:
            return False
        share = _worker_share()
        return share is not None and share <= 1

    def resolved_inflight(self, threads: int) -> int:
        return self.max_inflight if self.max_inflight is not None else 2 * threads


def available_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _worker_share() -> Optional[int]:
    """The cores each worker has, inside one of several DataLoader workers (else None)."""
    _worker, workers = worker_info()
    return available_cores() // workers if workers > 1 else None


def _from_env() -> EngineConfig:
    threads = os.environ.get("SHARDSTREAM_THREADS")
    enabled = os.environ.get("SHARDSTREAM_ENGINE", "1").lower() not in ("0", "false", "no", "off")
    return EngineConfig(enabled=enabled, threads=int(threads) if threads else None)


_lock = threading.Lock()
_defaults: Optional[EngineConfig] = None


def engine_defaults() -> EngineConfig:
    """The process-wide defaults (env vars, then set_engine_defaults)."""
    global _defaults
    with _lock:
        if _defaults is None:
            _defaults = _from_env()
        return _defaults


def set_engine_defaults(**changes: Any) -> EngineConfig:
    """Change the process-wide engine defaults, e.g. set_engine_defaults(threads=8, ordered=False)."""
    global _defaults
    current = engine_defaults()
    with _lock:
        _defaults = current.replace(**changes)
        return _defaults
