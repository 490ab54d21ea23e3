"""Where this process is: rank and world size (env vars, torch.distributed) and DataLoader worker.

torch is consulted only if something imported it: without torch there is no process group and
no DataLoader worker.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
from typing import Iterator, Optional, Tuple

from .._base.lazytorch import worker_info

__all__ = ["distributed_rank", "inherit_rank", "pytorch_worker_info", "pytorch_worker_seed", "simulated_layout"]

# (rank, world_size) of the process that sent this one a pipeline (a DataLoader worker started by
# spawn or forkserver: its parent's process group is not initialised here)
_INHERITED: Optional[Tuple[int, int]] = None


def distributed_rank() -> Optional[Tuple[int, int]]:
    """(rank, world_size) of this process's initialised torch.distributed group, else None (as
    RANK/WORLD_SIZE, which every child inherits, do not say where it is)."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return None
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def inherit_rank(rank_world: Optional[Tuple[int, int]]) -> None:
    """This process (a DataLoader worker) was handed a pipeline by a rank of a process group it
    does not belong to: report that rank and world size where neither RANK/WORLD_SIZE nor an
    initialised group say otherwise."""
    global _INHERITED
    if rank_world is not None:
        _INHERITED = (int(rank_world[0]), int(rank_world[1]))

_SIMULATED: contextvars.ContextVar[Optional[Tuple[int, int, int, int]]] = contextvars.ContextVar("layout", default=None)


@contextlib.contextmanager
def simulated_layout(rank: int, world_size: int, worker: int, num_workers: int) -> Iterator[None]:
    """Within this block (this thread only), pytorch_worker_info() reports the given layout:
    how a resume recomputes what another rank's worker did."""
    token = _SIMULATED.set((rank, world_size, worker, num_workers))
    try:
        yield
    finally:
        _SIMULATED.reset(token)


def pytorch_worker_info(group=None) -> Tuple[int, int, int, int]:
    """(rank, world_size, worker, num_workers) from env vars, torch.distributed and torch's worker info.

    torch is consulted only if something imported it: without torch there is no process group
    and no DataLoader worker.
    """
    simulated = _SIMULATED.get()
    if simulated is not None:
        return simulated
    rank, world_size, worker, num_workers = 0, 1, 0, 1
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        rank = int(os.environ["RANK"])
        world_size = int(os.environ["WORLD_SIZE"])
    else:
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            group = group or dist.group.WORLD
            rank = dist.get_rank(group=group)
            world_size = dist.get_world_size(group=group)
        elif _INHERITED is not None:
            rank, world_size = _INHERITED
    if "WORKER" in os.environ and "NUM_WORKERS" in os.environ:
        worker = int(os.environ["WORKER"])
        num_workers = int(os.environ["NUM_WORKERS"])
    else:
        worker, num_workers = worker_info()
    return rank, world_size, worker, num_workers


def pytorch_worker_seed(group=None) -> int:
    rank, _world_size, worker, _num_workers = pytorch_worker_info(group=group)
    return rank * 1000 + worker
