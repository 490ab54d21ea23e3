"""Resume state of the shard scheduler, and the range arithmetic that resuming needs.

The scheduler lays an epoch out as one virtual sequence of sample *positions*. Position p is
sample p mod N of the epoch's shard order (N samples in all); positions past N only occur with
remainder="wrap", where they repeat the epoch's first samples. A rank's share is a list of
half-open position ranges (one range until an elastic resume re-splits what is left), and each
worker of the rank takes a contiguous part of that share. The state records, for every
(rank, worker), how many samples of its part have been delivered: that is all a resume needs,
because parts are delivered front to back.

Pure: no I/O, no threads. Everything here is plain ints and tuples so that a state round-trips
through JSON (`to_dict` / `from_dict`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

__all__ = [
    "SchedulerState",
    "merge_ranges",
    "part_bounds",
    "ranges_length",
    "rank_share",
    "rebase_resampled",
    "rebase_split",
    "take_ranges",
    "undelivered",
]

Range = Tuple[int, int]


def part_bounds(total: int, parts: int, index: int) -> Range:
    """Offsets [start, stop) of part `index` when `total` items are cut into `parts` contiguous
    parts whose sizes differ by at most one (the larger parts first)."""
    base, extra = divmod(total, parts)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


def ranges_length(ranges: Iterable[Range]) -> int:
    return sum(stop - start for start, stop in ranges)


def take_ranges(ranges: Sequence[Range], start: int, stop: int) -> List[Range]:
    """The items at offsets [start, stop) of the concatenation of `ranges`, as ranges."""
    result: List[Range] = []
    offset = 0
    for lo, hi in ranges:
        if offset >= stop:
            break
        a = max(start - offset, 0)
        b = min(stop - offset, hi - lo)
        if a < b:
            result.append((lo + a, lo + b))
        offset += hi - lo
    return result


def merge_ranges(ranges: Iterable[Range]) -> List[Range]:
    """Drop empty ranges and join a range with the next one when they touch, keeping the order
    (not a sort: a wrapped share may run 90..100 then 0..3, and that order is the delivery order)."""
    result: List[Range] = []
    for lo, hi in ranges:
        if lo >= hi:
            continue
        if result and result[-1][1] == lo:
            result[-1] = (result[-1][0], hi)
        else:
            result.append((lo, hi))
    return result


def _nested_tuple(value: Any, depth: int) -> Any:
    if depth == 0:
        return int(value)
    return tuple(_nested_tuple(v, depth - 1) for v in value)


@dataclass(frozen=True)
class SchedulerState:
    """Where an epoch stands: the layout, each rank's share, and what each worker delivered.

    Args:
        epoch: the epoch (it seeds the shard order).
        world_size, num_workers: the layout the shares and `delivered` refer to.
        delivered: delivered[rank][worker] = samples of that worker's part already delivered.
        assigned: per rank, the position ranges of its share; None means the fresh epoch's blocks
            (rank r: positions [r*n, (r+1)*n)). Set by an elastic resume in split mode.
        quota: resampled mode after an elastic resume: samples per rank for the rest of the
            epoch (None: the configured samples_per_epoch).
        generation: how many times the layout changed this epoch; resampled mode draws fresh
            streams for each generation, so a re-split rank does not replay another's draws.
        shards, samples: what the state was taken over (count of shards; samples per epoch when
            known), checked on resume so a state is never applied to a different shard list.
    """

    epoch: int = 0
    world_size: int = 1
    num_workers: int = 1
    # Lists are accepted (e.g. straight from JSON) and stored as tuples (see __post_init__).
    delivered: Sequence[Sequence[int]] = field(default=((0,),))
    assigned: Optional[Sequence[Sequence[Range]]] = None
    quota: Optional[int] = None
    generation: int = 0
    shards: Optional[int] = None
    samples: Optional[int] = None

    def __post_init__(self) -> None:
        # Accept lists (e.g. straight from JSON) but store tuples, so the state stays hashable.
        object.__setattr__(self, "delivered", _nested_tuple(self.delivered, 2))
        if self.assigned is not None:
            object.__setattr__(self, "assigned", _nested_tuple(self.assigned, 3))
        if self.epoch < 0 or self.world_size < 1 or self.num_workers < 1 or self.generation < 0:
            raise ValueError("epoch and generation must be >= 0; world_size and num_workers >= 1")
        if len(self.delivered) != self.world_size or any(
            len(row) != self.num_workers or min(row) < 0 for row in self.delivered
        ):
            raise ValueError(
                f"delivered must be world_size x num_workers = {self.world_size} x "
                f"{self.num_workers} non-negative counts"
            )
        if self.assigned is not None and len(self.assigned) != self.world_size:
            raise ValueError("assigned must hold one list of ranges per rank")
        if self.quota is not None and self.quota < 0:
            raise ValueError("quota must be >= 0")

    @classmethod
    def fresh(cls, epoch: int, world_size: int, num_workers: int = 1, **fingerprint: Any) -> "SchedulerState":
        """The start of an epoch: nothing delivered yet."""
        delivered = tuple((0,) * num_workers for _ in range(world_size))
        return cls(epoch, world_size, num_workers, delivered, **fingerprint)

    def same_layout(self, world_size: int, num_workers: int) -> bool:
        return self.world_size == world_size and self.num_workers == num_workers

    def with_delivered(self, rank: int, worker: int, count: int) -> "SchedulerState":
        rows = [list(row) for row in self.delivered]
        rows[rank][worker] = count
        return dataclasses.replace(self, delivered=rows)

    @classmethod
    def merged(cls, states: Sequence["SchedulerState"]) -> "SchedulerState":
        """Combine the states that the ranks saved (each knows only its own counters) into one:
        per (rank, worker) the largest count. All states must describe the same epoch layout."""
        if not states:
            raise ValueError("no states to merge")
        first = states[0]
        for other in states[1:]:
            if dataclasses.replace(other, delivered=first.delivered) != first:
                raise ValueError("cannot merge states of different epochs, layouts or shard lists")
        rows = [
            [max(s.delivered[r][w] for s in states) for w in range(first.num_workers)]
            for r in range(first.world_size)
        ]
        return dataclasses.replace(first, delivered=rows)

    def to_dict(self) -> Dict[str, Any]:
        """Plain types only (ints, lists, None): safe for JSON and torch.save."""
        return {
            "epoch": self.epoch,
            "world_size": self.world_size,
            "num_workers": self.num_workers,
            "delivered": [list(row) for row in self.delivered],
            "assigned": None if self.assigned is None else [[list(r) for r in share] for share in self.assigned],
            "quota": self.quota,
            "generation": self.generation,
            "shards": self.shards,
            "samples": self.samples,
        }

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "SchedulerState":
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def rank_share(state: SchedulerState, rank: int, per_rank: int) -> List[Range]:
    """Rank `rank`'s share of the epoch as position ranges (`per_rank`: a fresh epoch's block)."""
    if state.assigned is not None:
        return list(state.assigned[rank])
    return [(rank * per_rank, (rank + 1) * per_rank)] if per_rank else []


def undelivered(state: SchedulerState, rank: int, per_rank: int) -> List[Range]:
    """What rank `rank` has not delivered yet: the tail of each worker's part, in worker order
    (which is position order: parts are contiguous pieces of the share)."""
    share = rank_share(state, rank, per_rank)
    total = ranges_length(share)
    result: List[Range] = []
    for worker, done in enumerate(state.delivered[rank]):
        start, stop = part_bounds(total, state.num_workers, worker)
        if done > stop - start:
            raise ValueError(f"rank {rank} worker {worker} delivered {done} of a {stop - start}-sample part")
        result.extend(take_ranges(share, start + done, stop))
    return merge_ranges(result)


def rebase_split(state: SchedulerState, per_rank: int, world_size: int, num_workers: int, wrap: bool) -> SchedulerState:
    """The state that finishes the epoch on a new layout; `delivered` restarts from zero.

    Same world size: each rank keeps what it has left and re-cuts it for its new workers, so
    nothing is lost or repeated and every rank still totals `per_rank` samples this epoch. New
    world size: the undelivered positions of all ranks, in rank order (= position order), are
    cut into equal contiguous shares; with wrap=False the last (left % world_size) are dropped,
    with wrap=True the first (-left % world_size) are repeated at the end.
    """
    if state.same_layout(world_size, num_workers):
        return state
    if world_size == state.world_size:
        shares = [undelivered(state, rank, per_rank) for rank in range(world_size)]
    else:
        left = merge_ranges(r for rank in range(state.world_size) for r in undelivered(state, rank, per_rank))
        total = ranges_length(left)
        each = -(-total // world_size) if wrap else total // world_size
        padded = list(left)
        while total and ranges_length(padded) < each * world_size:  # may wrap more than once
            padded.extend(take_ranges(left, 0, each * world_size - ranges_length(padded)))
        shares = [merge_ranges(take_ranges(padded, r * each, (r + 1) * each)) for r in range(world_size)]
    return dataclasses.replace(
        SchedulerState.fresh(state.epoch, world_size, num_workers, shards=state.shards, samples=state.samples),
        assigned=shares,
        generation=state.generation + 1,
    )


def rebase_resampled(state: SchedulerState, per_rank: int, world_size: int, num_workers: int, wrap: bool) -> SchedulerState:
    """Resampled mode on a new layout: the samples still owed by all ranks together are shared
    out equally (remainder as in split mode) and drawn from fresh streams."""
    if state.same_layout(world_size, num_workers):
        return state
    current = state.quota if state.quota is not None else per_rank
    left = sum(current - sum(row) for row in state.delivered)
    if left < 0:
        raise ValueError("the state records more samples delivered than the epoch holds")
    quota = -(-left // world_size) if wrap else left // world_size
    return dataclasses.replace(
        SchedulerState.fresh(state.epoch, world_size, num_workers, shards=state.shards, samples=state.samples),
        quota=quota,
        generation=state.generation + 1,
    )
