"""Who runs the shard tasks: this process, a pool of processes, or Ray Data tasks on a cluster.

Every engine runs `write_shard` on whole planned shards, so the bytes written do not depend on
the engine, the number of workers or the order in which tasks finish.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Callable, Dict, Optional, Sequence

from .._errors import ShardStreamError, UsageError
from .._redact import redact
from ._plan import ShardTask
from ._shardfile import ShardResult, WriteContext, write_shard

__all__ = ["run_local", "run_ray"]

OnResult = Callable[[ShardResult], None]


def run_local(tasks: Sequence[ShardTask], ctx: WriteContext, workers: int, on_result: OnResult) -> None:
    """Write the shards here (one worker) or in `workers` processes (forkserver, else spawn)."""
    if workers <= 1 or len(tasks) <= 1:
        for task in tasks:
            on_result(write_shard(task, ctx))
        return
    method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    with ProcessPoolExecutor(min(workers, len(tasks)), mp_context=multiprocessing.get_context(method)) as pool:
        futures = [pool.submit(write_shard, task, ctx) for task in tasks]
        try:
            for future in as_completed(futures):
                on_result(future.result())
        except BaseException:
            for future in futures:
                future.cancel()
            raise


def _ray_write(row: Dict[str, bytes]) -> Dict[str, bytes]:
    """A Ray Data row in (a pickled task and context), a pickled ShardResult out."""
    task, ctx = pickle.loads(row["task"])
    return {"result": pickle.dumps(write_shard(task, ctx))}


def _cause(exn: BaseException) -> BaseException:
    """The ShardStreamError a Ray task raised, out of Ray's wrappers (else `exn`)."""
    seen = set()
    current: Optional[BaseException] = exn
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ShardStreamError):
            return current
        cause = getattr(current, "cause", None)
        current = cause if isinstance(cause, BaseException) else (current.__cause__ or current.__context__)
    return exn


def run_ray(
    tasks: Sequence[ShardTask], ctx: WriteContext, on_result: OnResult, *, address: Optional[str] = None,
    cpus: Optional[int] = None,
) -> None:
    """Write the shards as Ray Data tasks, one block (one task) per shard. Connects to `address`
    ("auto", "ray://host:10001", "host:6379"), else starts a local Ray for the job, bound to
    127.0.0.1 with `cpus` CPUs and no dashboard, and stops it at the end."""
    try:
        import ray
        import ray.data
    except ImportError:
        raise UsageError("--engine ray needs Ray: pip install 'shardstream[ray]'") from None
    started = False
    if not ray.is_initialized():
        quiet = {"log_to_driver": False, "logging_level": logging.WARNING}
        if address:
            ray.init(address=address, **quiet)
        else:
            ray.init(num_cpus=cpus or os.cpu_count(), include_dashboard=False, _node_ip_address="127.0.0.1", **quiet)
        started = True
    try:
        data_context = ray.data.DataContext.get_current()
        data_context.enable_progress_bars = False  # the command shows its own
        rows = [{"task": pickle.dumps((task, ctx))} for task in tasks]
        dataset = ray.data.from_items(rows, override_num_blocks=len(rows)).map(_ray_write, num_cpus=1)
        try:
            for row in dataset.iter_rows():
                on_result(pickle.loads(row["result"]))
        except Exception as exn:
            cause = _cause(exn)
            if cause is not exn:
                raise cause from None
            raise ShardStreamError(f"a Ray task failed: {redact(exn)}") from None
    finally:
        if started:
            ray.shutdown()

