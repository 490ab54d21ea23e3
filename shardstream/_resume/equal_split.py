"""`split_by_node` with equal work per rank where sample counts are cheap to know.

webdataset's `split_by_node` hands every world_size-th *shard* to a rank, so ranks with larger
shards run longer and DDP hangs at the end of an epoch. Here the node splitter decides, per
pass and identically on every rank, how to split:

- world size 1: there is nothing to balance. The shards pass in the epoch's order, split over
  the DataLoader workers shard by shard; nothing is counted or read.
- every shard's sample count is cheap to know (`counts=` given in code, `sizes.json` beside the
  shards, `.idx` files, or local uncompressed shards whose headers are walked memory-mapped; see
  `_shard.counts`): the scheduler gives every rank the same number of samples (the < world_size
  leftover samples of an epoch are dropped by default), its workers equal parts, and a new shard
  order every epoch, the same on all ranks.
- otherwise (remote shards without counts): webdataset's split, shard by shard, with a one-time
  warning naming the fixes. Nothing downloads the dataset to count it unless asked:
  `count_shards=True` (or SHARDSTREAM_COUNT_SHARDS=1) reads the uncounted shards once, in
  parallel, through the loader's fetchers and cache.

Items are yielded as `dict(url, start, stop)`, already cut for this worker.

Placed after the shard reader (`DataPipeline(SimpleShardList(urls), tarfile_to_samples(),
split_by_node)`: a small validation set spread over ranks sample by sample), it receives
samples, not shards: it then splits them as webdataset's function does, every world_size-th
item from this rank's (`mode` ITEM_SPLIT; no elastic resume).

Resume: a loader's saved state holds, per DataLoader worker, the resume position of the last
item delivered (see `_resume.positions`), and its layout says when the pass was split shard by shard.
With every rank's state (`history`), `resume_state` turns those into the samples each old rank
had not delivered, so the epoch can be finished on another world size or worker count
(`ShardScheduler.resume_plan` shares them out); that needs every shard's count.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import warnings
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
    Set,
    Tuple,
)

from .._shard.counts import cheap_counts, read_counts
from .._base.errors import UsageError
from .._plan.ranks import pytorch_worker_info
from .states import worker_view
from .._shard.samples import TarShardSamples
from .._shard.origin import source_url
from .._plan.elastic import merge_ranges, ranges_length, take_ranges
from .._plan.scheduler import SchedulerState, ShardScheduler
from .._plan.shards import SchedulerConfig, Shard, Slice
from .._stages.contract import PipelineStage
from .._tar.reader import TarMember

__all__ = ["EqualSplit", "ITEM_SPLIT", "SHARD_SPLIT", "WORKER_SPLIT", "check_history", "is_shard", "resume_state"]


def is_shard(item: Any) -> bool:
    """Whether a pipeline item names a shard (a URL, or a dict with one), not a sample."""
    return isinstance(item, (str, os.PathLike)) or (isinstance(item, dict) and "url" in item)

WORKER_SPLIT = "worker_split"  # an item already cut for this worker: split_by_worker lets it pass
SHARD_SPLIT = "shards"  # a layout's "node_split" when a pass was split shard by shard
ITEM_SPLIT = "items"  # ... when the splitter got samples, not shards, and split them one by one
COUNT_SHARDS_ENV = "SHARDSTREAM_COUNT_SHARDS"
_warned = False


def _warn_uncounted(missing: int, total: int) -> None:
    global _warned
    if _warned:
        return
    _warned = True
    warnings.warn(
        f"split_by_node: {missing} of {total} shards have no known sample count (no sizes.json or .idx "
        "beside them, not local uncompressed tars), so ranks get equal numbers of shards, as in webdataset, "
        "not equal numbers of samples; DDP ranks may then run uneven epochs. To split by samples: write the "
        "counts once with `shardstream index SHARDS` (sizes.json), pass EqualSplit(counts=...), or let the "
        f"loader count them by reading the shards (EqualSplit(count_shards=True) or {COUNT_SHARDS_ENV}=1).",
        stacklevel=2,
    )


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
        if state.get("split") != first.get("split") or lay.get("node_split") != layout.get("node_split"):
            raise UsageError("the saved states come from different resumed runs")
        by_rank[int(lay["rank"])] = state
    if sorted(by_rank) != list(range(world)) or len(history) != world:
        raise UsageError(f"resuming on a new layout needs the states of all {world} ranks, got ranks "
                         f"{sorted(int(s['layout']['rank']) for s in history)}")
    return by_rank


Replay = Callable[[int, int, int, int, int, int, int], List[int]]


def resume_state(
    scheduler: ShardScheduler, history: Sequence[Mapping[str, Any]], replay: Optional[Replay] = None,
    wanted: Optional[Tuple[int, Set[int]]] = None,
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

    `wanted` = (world_size, ranks): the state is to be rebased onto that world size and read for
    those ranks' shares alone. Then only the old workers whose undelivered samples can land in
    those shares are replayed (a replay runs the buffer over the worker's whole part, so
    replaying every old worker in every new one cost O(samples delivered by all ranks)); the
    others get stand-in positions of the right count, which only the other ranks' shares hold.
    """
    by_rank = check_history(history)
    first = history[0]
    world, workers = int(first["layout"]["world_size"]), int(first["layout"]["num_workers"])
    epoch = int(first.get("epoch") or 0)
    previous = first.get("split")
    by_shards = not previous and first["layout"].get("node_split") == SHARD_SPLIT

    def origin_for(ranks: Optional[Set[int]]) -> SchedulerState:
        """The old layout's state at its start (exact for `ranks`' shares; None: all)."""
        if not previous:
            return scheduler.fresh_state(epoch, world, workers)
        inner = resume_state(scheduler, previous, replay, None if ranks is None else (world, ranks))
        return scheduler.rebase(inner, world, workers)

    def undelivered(origin: SchedulerState, rank: int, worker: int, exact: bool) -> List[Tuple[int, int]]:
        """The epoch positions of this worker's part that its saved position had not delivered
        (not `exact`: as many positions, not necessarily those, where finding them needs a replay)."""
        if by_shards:
            part = scheduler.shard_part_ranges(epoch, rank, world, worker, workers)
        else:
            part = scheduler.part_ranges(origin, rank, world, worker, workers)
        length = ranges_length(part)
        per_worker, positions = worker_view(dict(by_rank[rank]))
        position = positions.get(worker)
        if position is None:
            if per_worker.get(worker, 0):
                raise UsageError("resuming on a new layout needs resume positions, and this state has none")
            return part
        if int(position[0]):
            raise UsageError("resuming on a new layout is not supported after with_epoch/repeat passes")
        if len(position) == 4:  # seek: a prefix of the part
            if by_shards:  # every shard was an item, empty ones too
                pieces = scheduler.shard_plan(epoch, rank, world, worker, workers)
            else:
                pieces = _pieces(scheduler.resume_plan(origin, rank, world, worker, workers))
            return take_ranges(part, sum(p.count or 0 for p in pieces[: int(position[1])]) + int(position[2]), length)
        if replay is None:
            raise UsageError("resuming on a new layout with a count position needs the pipeline's seeded shuffle")
        if not exact:
            return take_ranges(part, int(position[1]), length)
        delivered = set(replay(epoch, rank, world, worker, workers, length, int(position[1])))
        runs = itertools.groupby(range(length), key=lambda offset: offset in delivered)
        return [r for done, offsets in runs if not done for r in _span(part, list(offsets))]

    seeks = any(len(p or ()) == 4 for state in history for p in worker_view(dict(state))[1].values())
    if wanted is None or (previous and seeks):  # (a seek counts slices, which stand-in positions cut otherwise)
        origin = origin_for(None)
        parts = [[undelivered(origin, rank, worker, True) for worker in range(workers)] for rank in range(world)]
    else:
        origin = origin_for(set())  # (its shares' lengths are exact, which is all the counts need)
        parts = [[undelivered(origin, rank, worker, False) for worker in range(workers)] for rank in range(world)]
        lefts = [[ranges_length(part) for part in row] for row in parts]
        needed = _needed(lefts, wanted, scheduler.config.remainder == "wrap")
        if needed:
            origin = origin_for({rank for rank, _worker in needed})
            for rank, worker in needed:
                parts[rank][worker] = undelivered(origin, rank, worker, True)
    assigned = [merge_ranges(r for part in row for r in part) for row in parts]
    fresh = SchedulerState.fresh(epoch, world, workers, shards=origin.shards, samples=origin.samples)
    return dataclasses.replace(fresh, assigned=assigned, generation=origin.generation)


def _needed(lefts: List[List[int]], wanted: Tuple[int, Set[int]], wrap: bool) -> Set[Tuple[int, int]]:
    """The old (rank, worker)s whose undelivered samples (`lefts`: their counts) can land in the
    shares of `wanted` = (new world size, new ranks), as `rebase_split` cuts them."""
    world, ranks = wanted
    if world == len(lefts):  # each rank keeps its own
        return {(rank, worker) for rank in ranks for worker in range(len(lefts[rank]))}
    total = sum(map(sum, lefts))
    if not total:
        return set()
    each = -(-total // world) if wrap else total // world
    spans: List[Tuple[int, int]] = []  # in the undelivered sequence, which "wrap" repeats
    for rank in ranks:
        lo = rank * each % total
        if each >= total:
            spans.append((0, total))
        else:
            spans += [(lo, min(lo + each, total)), (0, max(0, lo + each - total))]
    needed, offset = set(), 0
    for rank, row in enumerate(lefts):
        for worker, left in enumerate(row):
            if left and any(lo < offset + left and offset < hi for lo, hi in spans):
                needed.add((rank, worker))
            offset += left
    return needed


def _span(part: List[Tuple[int, int]], offsets: List[int]) -> List[Tuple[int, int]]:
    """The epoch positions of consecutive offsets [first, last] of a worker's part."""
    return take_ranges(part, offsets[0], offsets[-1] + 1)


class EqualSplit(PipelineStage):
    """Node (and worker) splitter: equal samples per rank when sample counts are cheap to know,
    else webdataset's shard-by-shard split (see the module doc for the rule).

    Args:
        seed: seeds the per-epoch shard order; must be the same on every rank.
        shuffle: reshuffle the shard order every epoch (False: keep the incoming order).
        remainder: "drop" (default) or "wrap" for the samples that do not divide evenly.
        group: the torch.distributed group that defines rank and world size.
        counts: sample counts by URL or file name (e.g. a loaded sizes.json).
        count_shards: read the shards that nothing cheaper counts, once, in parallel through the
            loader's fetchers and cache (default: the SHARDSTREAM_COUNT_SHARDS variable, else off).
    """

    name = "split_by_node"

    def __init__(
        self, seed: int = 0, shuffle: bool = True, remainder: str = "drop", group: Any = None,
        counts: Optional[Mapping[str, int]] = None, count_shards: Optional[bool] = None,
    ) -> None:
        self.config = SchedulerConfig(seed=int(seed), shuffle=shuffle, remainder=remainder)  # type: ignore[arg-type]  # checked there
        self.group = group
        self.epoch: Optional[int] = None
        self.passes = 0
        self.history: Optional[List[Mapping[str, Any]]] = None  # the next pass resumes from these states
        self.replay: Optional[Replay] = None  # recomputes count positions (see resume_state)
        self.given = {str(k): int(v) for k, v in (counts or {}).items()}
        if count_shards is None:
            count_shards = os.environ.get(COUNT_SHARDS_ENV, "0").lower() not in ("", "0", "false", "no")
        self.count_shards = bool(count_shards)
        # How to read a shard to count it: WebDataset sets its own reader (its cache, its fetch
        # options); else a plain reader through the fetchers.
        self.reader: Optional[Callable[[str], Iterable[List[TarMember]]]] = None
        # What is known, kept on the stage: a loader fills it in the main process before starting
        # its workers, so they get it with the dataset instead of each looking again.
        self.counts: Dict[str, int] = {}
        self.uncounted: Set[str] = set()  # no cheap count: not looked up again
        self.mode: Optional[str] = None  # "samples", SHARD_SPLIT or ITEM_SPLIT, as the last pass decided
        # The last shard list's counts and scheduler, for the next pass over the same list (not
        # sent to spawned workers: they make their own).
        self._kept_counts: Optional[Tuple[List[str], List[int]]] = None
        self._kept_scheduler: Optional[Tuple[List[str], Optional[List[int]], ShardScheduler]] = None

    def set_epoch(self, epoch: int) -> None:
        """Use this epoch number for the next passes (else each pass counts as a new epoch)."""
        self.epoch = epoch

    def __getstate__(self) -> Dict[str, Any]:
        # A process group does not pickle, and a DataLoader worker started by spawn or forkserver
        # is not in it anyway: it is sent as the rank and world size it gives here.
        state = dict(self.__dict__)
        state["_kept_counts"] = state["_kept_scheduler"] = None
        if state.get("group") is not None:
            rank, world = pytorch_worker_info(group=self.group)[:2]
            state["group"], state["_group_layout"] = None, (rank, world)
        return state

    def _layout(self) -> Tuple[int, int, int, int]:
        rank, world, worker, workers = pytorch_worker_info(group=self.group)
        sent = self.__dict__.get("_group_layout")
        if sent is not None and self.group is None:
            rank, world = sent
        return rank, world, worker, workers

    def state_settings(self) -> Dict[str, Any]:
        """In a saved state's fingerprint: another seed or rule splits the epoch otherwise."""
        return {"seed": self.config.seed, "shuffle": self.config.shuffle, "remainder": self.config.remainder}

    def run(self, src: Iterable[Any]) -> Iterator[Dict[str, Any]]:
        rank, world, worker, workers = self._layout()
        epoch = self.epoch if self.epoch is not None else self.passes
        self.passes += 1
        history, self.history = self.history, None
        src = iter(src)
        first = next(src, None)
        if first is None:
            return
        if not is_shard(first):  # after the shard reader: webdataset's split of its items
            self.mode = ITEM_SPLIT
            if history:
                raise UsageError("resuming on another world size or worker count needs split_by_node before the shard "
                                 "reader (it got samples here, and splits them one by one)")
            yield from itertools.islice(itertools.chain([first], src), rank, None, world)
            return
        urls = [source_url(item, False)[0] for item in itertools.chain([first], src)]
        counts: Optional[List[int]]
        plan: Iterable[Slice]
        if history:
            counts = self._counts(urls, required=True)
            scheduler = self._scheduler(urls, counts)
            state = resume_state(scheduler, history, self.replay, (world, {rank}))
            plan = _pieces(scheduler.resume_plan(state, rank, world, worker, workers))
        else:
            counts = self.prepare(urls, world)
            scheduler = self._scheduler(urls, counts)
            if counts is None:
                plan = scheduler.iter_shard_plan(epoch, rank, world, worker, workers)
            elif not scheduler.samples_per_rank(epoch, world):
                raise UsageError(
                    f"the epoch has {sum(counts)} samples in {len(urls)} shards: "
                    f"fewer than the {world} ranks, so every rank would get none"
                )
            else:
                fresh = (p for p in scheduler.iter_plan(epoch, rank, world, worker, workers) if p.stop != p.start)
                # Shards counted empty are in nobody's plan: one worker of one rank looks that they
                # are, at its end (a stale count of 0 would lose their samples unseen).
                empty = [i for i, count in enumerate(counts) if count == 0]
                slot, slots = rank * workers + worker, world * workers
                # (after the plan: a saved position's slice index counts the plan's slices alone)
                plan = itertools.chain(fresh, [Slice(urls[i], 0, 0, i) for n, i in enumerate(empty) if n % slots == slot])
        for piece in plan:
            # (a piece that ends where the count says the shard does: the reader checks it ends there)
            counted = None if counts is None else counts[piece.shard_index]
            yield {"url": piece.url, "start": piece.start, "stop": piece.stop, "counted": counted, WORKER_SPLIT: True}

    def prepare(self, urls: List[str], world: Optional[int] = None) -> Optional[List[int]]:
        """Decide how to split these shards on this world size: their sample counts (split by
        samples) or None (shard by shard); `mode` records it. A loader calls this in its main
        process before starting workers, so they inherit what it found."""
        if world is None:
            world = self._layout()[1]
        counts = None if world == 1 else self._counts(urls, required=False)  # world 1: nothing to balance, read nothing
        self.mode = "samples" if counts is not None else SHARD_SPLIT
        self._scheduler(urls, counts)  # (made here, in a loader's main process, forked workers have it)
        return counts

    def _scheduler(self, urls: List[str], counts: Optional[List[int]]) -> ShardScheduler:
        """The scheduler over these shards, kept for the next pass over the same list: over a
        million shards, making one costs seconds."""
        kept = self._kept_scheduler
        if kept is not None and kept[1] == counts and kept[0] == urls:
            return kept[2]
        scheduler = ShardScheduler(self._shards(urls, counts), self.config)
        self._kept_scheduler = (urls, counts, scheduler)
        return scheduler

    def _counts(self, urls: List[str], required: bool) -> Optional[List[int]]:
        """Every shard's sample count from what is cheap, then (count_shards) by reading; None
        when some stay unknown (an error when `required`)."""
        kept = self._kept_counts
        if kept is not None and kept[0] == urls:
            return kept[1]
        missing = [url for url in dict.fromkeys(urls) if url not in self.counts and (required or url not in self.uncounted)]
        if missing:
            found = cheap_counts(missing, self.given)
            self.counts.update((url, n) for url, n in zip(missing, found) if n is not None)
            missing = [url for url, n in zip(missing, found) if n is None]
        if missing and self.count_shards:
            self.counts.update(zip(missing, read_counts(missing, self.reader or TarShardSamples().batches)))
            missing = []
        self.uncounted.update(missing)
        if any(url not in self.counts for url in urls):
            unknown = sum(1 for url in dict.fromkeys(urls) if url not in self.counts)
            if required:
                raise UsageError(
                    f"resuming on a new layout needs every shard's sample count; {unknown} of {len(urls)} shards "
                    "have none: write sizes.json with `shardstream index`, pass EqualSplit(counts=...) or "
                    "EqualSplit(count_shards=True)"
                )
            _warn_uncounted(unknown, len(set(urls)))
            return None
        counts = [self.counts[url] for url in urls]
        self._kept_counts = (urls, counts)
        return counts

    @staticmethod
    def _shards(urls: List[str], counts: Optional[List[int]]) -> List[Shard]:
        return [Shard(url, None if counts is None else counts[i]) for i, url in enumerate(urls)]

    def __call__(self, src: Iterable[Any]) -> Iterator[Dict[str, Any]]:
        return self.run(src)
