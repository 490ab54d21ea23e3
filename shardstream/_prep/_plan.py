"""The shard plan: sample order (seeded), shard boundaries and names, fixed before anything is
written, so that workers and engines only ever write whole shards and the result never depends
on how many there are or which finishes first."""

from __future__ import annotations

import hashlib
from typing import List, NamedTuple, Optional, Sequence, Tuple

from .._base.errors import UsageError
from ._rows import Row

__all__ = ["ShardTask", "plan_shards", "rank_slice", "seeded_order"]


class ShardTask(NamedTuple):
    """One shard to write: its number, file name and samples in order."""

    number: int
    name: str
    rows: Tuple[Row, ...]


def seeded_order(n: int, seed: int) -> List[int]:
    """A permutation of range(n) from `seed`: items sorted by a keyed hash of their position,
    the same on every Python version and machine (unlike `random.shuffle`'s internals)."""
    salt = seed.to_bytes(16, "little", signed=True)
    return sorted(range(n), key=lambda i: hashlib.blake2b(i.to_bytes(8, "little"), digest_size=8, key=salt).digest())


def plan_shards(
    rows: Sequence[Row], *, pattern: str, maxcount: int, maxsize: Optional[float] = None, seed: Optional[int] = None,
) -> List[ShardTask]:
    """Cut `rows` (shuffled first when a seed is given) into shards: a new shard starts when the
    current one holds `maxcount` samples or `maxsize` input bytes (ShardWriter's rule).

    Resharding rows (with an origin) keep their source order inside each shard, so that a shard
    is written by reading each source shard once, front to back.
    """
    order = seeded_order(len(rows), seed) if seed is not None else range(len(rows))
    tasks: List[ShardTask] = []
    current: List[Row] = []
    size = 0

    def close() -> None:
        chunk = sorted(current, key=lambda r: r.origin or (0, 0)) if current[0].origin is not None else current
        tasks.append(ShardTask(len(tasks), pattern % len(tasks), tuple(chunk)))

    for i in order:
        row = rows[i]
        if current and (len(current) >= maxcount or (maxsize is not None and size >= maxsize)):
            close()
            current, size = [], 0
        if maxsize is not None:
            if row.size is None:
                raise UsageError("--maxsize needs every sample's size; this input does not know them: use --maxcount")
            size += row.size
        current.append(row)
    if current:
        close()
    return tasks


def rank_slice(tasks: Sequence[ShardTask], rank: int, world_size: int) -> List[ShardTask]:
    """The contiguous range of shards that `rank` of `world_size` writes (SLURM arrays etc.)."""
    n = len(tasks)
    return list(tasks[rank * n // world_size : (rank + 1) * n // world_size])
