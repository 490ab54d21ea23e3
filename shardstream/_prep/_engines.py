"""Who runs the shard tasks: this process, a pool of processes, or Ray Data tasks on a cluster.

Every engine runs `write_shard` on whole planned shards, so the bytes written do not depend on
the engine, the number of workers or the order in which tasks finish.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import signal
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Dict, Optional, Sequence

from .._base.errors import ShardStreamError, UsageError
from .._base.redact import redact
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
    with ProcessPoolExecutor(min(workers, len(tasks)), mp_context=multiprocessing.get_context(method),
                             initializer=_worker_signals) as pool:
        futures = [pool.submit(_write_in_worker, task, ctx) for task in tasks]
        try:
            for future in as_completed(futures):
                on_result(future.result())
        except BaseException as exn:
            for future in futures:
                future.cancel()
            if isinstance(exn, KeyboardInterrupt):  # stop the shards being written: their temp files go
                _stop_workers(pool)
            if isinstance(exn, BrokenProcessPool):
                raise ShardStreamError(
                    "a worker process died while writing shards (killed, or out of memory?): the shards it and "
                    "the others were writing are not written; run again with --overwrite") from None
            raise


def _worker_signals() -> None:
    """In a pool worker: Ctrl-C (sent to the whole process group) is the parent's to handle; the
    parent's SIGTERM ends the shard being written as an exception does (its temp file removed),
    then the worker."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _terminated)


_terminating: Optional[int] = None  # the exit status a SIGTERM asked for, once one came


def _terminated(signum: int, frame: Any) -> None:
    """The first SIGTERM unwinds the shard being written; later ones are ignored, so that they
    cannot cut that cleanup short. (ProcessPoolExecutor sends one more to every live worker when
    another one exits: raised inside the cleanup, in a tar stream's finaliser, it was printed as
    "Exception ignored" with a traceback, and could leave the temp file behind.)"""
    global _terminating
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _terminating = 128 + signum
    raise SystemExit(_terminating)


def _write_in_worker(task: ShardTask, ctx: WriteContext) -> ShardResult:
    """`write_shard` in a pool worker. Once a SIGTERM has unwound it, the worker exits: the pool's
    worker loop would catch the SystemExit, hand it back as the task's result and take the next
    task, which no later SIGTERM could stop."""
    try:
        return write_shard(task, ctx)
    except SystemExit:
        if _terminating is not None:
            os._exit(_terminating)  # (the shard's cleanup has run: nothing else is left to do)
        raise


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    terminate = getattr(pool, "terminate_workers", None)  # Python 3.14
    if terminate is not None:
        terminate()
        return
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        if process.is_alive():
            process.terminate()


def _ray_write(row: Dict[str, bytes]) -> Dict[str, bytes]:
    """A Ray Data row in (a pickled task and context), a pickled ShardResult out; a failure is
    shipped back as an item (Ray would wrap it in its own errors and log it as a crash)."""
    task, ctx = pickle.loads(row["task"])
    try:
        return {"result": pickle.dumps(write_shard(task, ctx)), "error": b""}
    except Exception as exn:
        try:
            shipped = pickle.dumps(exn)
        except Exception:  # an exception that does not pickle: its text, in our error tree
            shipped = pickle.dumps(ShardStreamError(f"shard {task.name}: {type(exn).__name__}: {redact(exn)}"))
        return {"result": b"", "error": shipped}


def run_ray(
    tasks: Sequence[ShardTask], ctx: WriteContext, on_result: OnResult, *, address: Optional[str] = None,
    cpus: Optional[int] = None, on_ready: Optional[Callable[[], None]] = None,
) -> None:
    """Write the shards as Ray Data tasks, one block (one task) per shard. Connects to `address`
    ("auto", "ray://host:10001", "host:6379"), else starts a local Ray for the job, bound to
    127.0.0.1 with `cpus` CPUs and no dashboard, and stops it at the end. `on_ready` is called
    once Ray is up (the caller times the writing apart from Ray's start)."""
    try:
        import ray
        import ray.data
    except ImportError:
        raise UsageError("--engine ray needs Ray: pip install 'shardstream[ray]'") from None
    started = False
    if not ray.is_initialized():
        quiet: Dict[str, Any] = {"log_to_driver": False, "logging_level": logging.WARNING}
        if address:
            ray.init(address=address, **quiet)
        else:
            ray.init(num_cpus=cpus or os.cpu_count(), include_dashboard=False, _node_ip_address="127.0.0.1", **quiet)
        started = True
    # Ray Data logs each execution at INFO, and a warning that we turned its progress bars off
    logging.getLogger("ray").setLevel(logging.WARNING)
    logging.getLogger("ray.data").setLevel(logging.ERROR)
    if on_ready is not None:
        on_ready()
    try:
        data_context = ray.data.DataContext.get_current()
        data_context.enable_progress_bars = False  # the command shows its own
        rows = [{"task": pickle.dumps((task, ctx))} for task in tasks]
        dataset = ray.data.from_items(rows, override_num_blocks=len(rows)).map(_ray_write, num_cpus=1)
        for row in dataset.iter_rows():
            if row["error"]:
                raise pickle.loads(row["error"])
            on_result(pickle.loads(row["result"]))
    finally:
        if started:
            ray.shutdown()

