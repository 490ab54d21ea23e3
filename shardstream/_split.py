"""Equal work per rank: `split_by_node` backed by the shard scheduler.

webdataset's `split_by_node` hands every world_size-th *shard* to a rank, so ranks with larger
shards run longer and DDP hangs at the end of an epoch. Here the node splitter reads the sample
counts, asks the scheduler for this (epoch, rank, worker)'s slices of shards, and yields them
as `dict(url, start, stop)`: every rank gets the same number of samples (the < world_size
leftover samples of an epoch are dropped by default), its DataLoader workers split that equally,
and the shard order is reshuffled every epoch, identically on all ranks.

Resume: a loader's saved state holds, per DataLoader worker, the resume position of the last
item delivered (see `_positions`). With every rank's state (`history`), `resume_state` turns
those into the samples each old rank had not delivered, so the epoch can be finished on another
world size or worker count (`ShardScheduler.resume_plan` shares them out).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
)

from ._counts import sample_counts
from ._errors import UsageError
from ._ranks import pytorch_worker_info
from ._resume import worker_view
from ._samples import source_url
from ._schedule_resume import merge_ranges, ranges_length, take_ranges
from ._scheduler import SchedulerConfig, SchedulerState, Shard, ShardScheduler, Slice
from ._stages import PipelineStage

__all__ = ["EqualSplit", "WORKER_SPLIT", "check_history", "resume_state"]

WORKER_SPLIT = "worker_split"  # an item already cut for this worker: split_by_worker lets it pass


def _pieces(plan: List[Slice]) -> List[Slice]:
    """The slices the splitter hands on (empty ones are skipped)."""
    return [p for p in plan if p.stop is None or p.stop > p.start]


def check_history(history: Sequence[Mapping[str, Any]]) -> Dict[int, Mapping[str, Any]]:
    """Check that saved states are one checkpoint of every rank of one layout; by rank."""
    if not history:
        raise UsageError("no saved states to resume from")
    first = history[0]
    layout = first.get("layout")
    if layout is None:
        raise UsageError("the saved state has no layout (saved by an older version): resume on the same layout")
    world, workers, epoch = int(layout["world_size"]), int(layout["num_workers"]), int(first.get("epoch") or 0)
    by_rank: Dict[int, Mapping[str, Any]] = {}
    for state in history:
        lay = state.get("layout") or {}
        if (lay.get("world_size"), lay.get("num_workers"), int(state.get("epoch") or 0)) != (world, workers, epoch):
            raise UsageError("the saved states are of different epochs or layouts")
        if state.get("split") != first.get("split"):
            raise UsageError("the saved states come from different resumed runs")
        by_rank[int(lay["rank"])] = state
    if sorted(by_rank) != list(range(world)) or len(history) != world:
        raise UsageError(f"resuming on a new layout needs the states of all {world} ranks, got ranks "
                         f"{sorted(int(s['layout']['rank']) for s in history)}")
    return by_rank


Replay = Callable[[int, int, int, int, int, int, int], List[int]]


def resume_state(
    scheduler: ShardScheduler, history: Sequence[Mapping[str, Any]], replay: Optional[Replay] = None
) -> SchedulerState:
    """The scheduler state at a checkpoint, from every rank's saved loader state.

    Each state has "epoch", "layout" {rank, world_size, num_workers}, "per_worker" (items
    delivered), "positions" (per worker, of its last item) and "split" (the history its own
    epoch was resumed from, or None). The result assigns each old rank exactly the samples none
    of its workers had delivered, so `resume_plan` on any layout shares out just those.

    A seek position [pass, slice, sample, offset] means the worker delivered the samples of the
    slices it finished plus `sample` of the current one. A count position [pass, n] means the
    samples its shuffle buffer (the pipeline's pivot) had handed on: `replay(epoch, rank,
    world_size, worker, num_workers, length, n)` gives their offsets in the worker's part by
    running the same seeded buffer over the offsets 0..length-1.
    """
    by_rank = check_history(history)
    first = history[0]
    world, workers = int(first["layout"]["world_size"]), int(first["layout"]["num_workers"])
    epoch = int(first.get("epoch") or 0)
    previous = first.get("split")
    origin = (
        scheduler.rebase(resume_state(scheduler, previous, replay), world, workers) if previous
        else scheduler.fresh_state(epoch, world, workers)
    )

    def undelivered(rank: int, worker: int) -> List[Tuple[int, int]]:
        """The epoch positions of this worker's part that its saved position had not delivered."""
        part = scheduler.part_ranges(origin, rank, world, worker, workers)
        length = ranges_length(part)
        per_worker, positions = worker_view(by_rank[rank])
        position = positions.get(worker)
        if position is None:
            if per_worker.get(worker, 0):
                raise UsageError("resuming on a new layout needs resume positions, and this state has none")
            return part
        if int(position[0]):
            raise UsageError("resuming on a new layout is not supported after with_epoch/repeat passes")
        if len(position) == 4:  # seek: a prefix of the part
            pieces = _pieces(scheduler.resume_plan(origin, rank, world, worker, workers))
            return take_ranges(part, sum(p.count or 0 for p in pieces[: int(position[1])]) + int(position[2]), length)
        if replay is None:
            raise UsageError("resuming on a new layout with a count position needs the pipeline's seeded shuffle")
        delivered = set(replay(epoch, rank, world, worker, workers, length, int(position[1])))
        runs = itertools.groupby(range(length), key=lambda offset: offset in delivered)
        return [r for done, offsets in runs if not done for r in _span(part, list(offsets))]

    assigned = [merge_ranges(r for worker in range(workers) for r in undelivered(rank, worker)) for rank in range(world)]
    fresh = SchedulerState.fresh(epoch, world, workers, shards=origin.shards, samples=origin.samples)
    return dataclasses.replace(fresh, assigned=assigned, generation=origin.generation)


def _span(part: List[Tuple[int, int]], offsets: List[int]) -> List[Tuple[int, int]]:
    """The epoch positions of consecutive offsets [first, last] of a worker's part."""
    return take_ranges(part, offsets[0], offsets[-1] + 1)


class EqualSplit(PipelineStage):
    """Node (and worker) splitter giving every rank the same number of samples.

    Args:
        seed: seeds the per-epoch shard order; must be the same on every rank.
        shuffle: reshuffle the shard order every epoch (False: keep the incoming order).
        remainder: "drop" (default) or "wrap" for the samples that do not divide evenly.
        group: the torch.distributed group that defines rank and world size.
    """

    name = "split_by_node"

    def __init__(self, seed: int = 0, shuffle: bool = True, remainder: str = "drop", group: Any = None) -> None:
        self.config = SchedulerConfig(seed=int(seed), shuffle=shuffle, remainder=remainder)
        self.group = group
        self.epoch: Optional[int] = None
        self.passes = 0
        self.history: Optional[List[Mapping[str, Any]]] = None  # the next pass resumes from these states
        self.replay: Optional[Replay] = None  # recomputes count positions (see resume_state)
        # Sample counts by URL, kept on the stage: a loader fills it in the main process before
        # starting its workers, so they get it with the dataset instead of each counting again.
        self.counts: Dict[str, int] = {}

    def set_epoch(self, epoch: int) -> None:
        """Use this epoch number for the next passes (else each pass counts as a new epoch)."""
        self.epoch = epoch

    def run(self, src: Iterable[Any]) -> Iterator[Dict[str, Any]]:
        rank, world, worker, workers = pytorch_worker_info(group=self.group)
        epoch = self.epoch if self.epoch is not None else self.passes
        self.passes += 1
        history, self.history = self.history, None
        urls = [source_url(item, False)[0] for item in src]
        if not urls:
            return
        shards = [Shard(url, count) for url, count in zip(urls, self.count(urls))]
        scheduler = ShardScheduler(shards, self.config)
        if history:
            plan = scheduler.resume_plan(resume_state(scheduler, history, self.replay), rank, world, worker, workers)
        else:
            if not scheduler.samples_per_rank(epoch, world):
                raise ValueError(
                    f"the epoch has {sum(s.samples or 0 for s in shards)} samples in {len(shards)} shards: "
                    f"fewer than the {world} ranks, so every rank would get none"
                )
            plan = scheduler.plan(epoch, rank, world, worker, workers)
        for piece in _pieces(plan):
            yield {"url": piece.url, "start": piece.start, "stop": piece.stop, WORKER_SPLIT: True}

    def count(self, urls: List[str]) -> List[int]:
        """The shards' sample counts (sizes.json, .idx, else a counting pass), kept on the stage."""
        missing = [url for url in dict.fromkeys(urls) if url not in self.counts]
        if missing:
            self.counts.update(zip(missing, sample_counts(missing)))
        return [self.counts[url] for url in urls]

    def __call__(self, src: Iterable[Any]) -> Iterator[Dict[str, Any]]:
        return self.run(src)
