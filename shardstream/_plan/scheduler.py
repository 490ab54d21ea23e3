"""The shard scheduler: which samples of which shards each (epoch, rank, worker) reads, in order.

Pure arithmetic over a list of `Shard`s: no I/O, no threads, no torch. Everything is reproducible
from (seed, epoch, rank, world_size, worker, num_workers), whatever the thread timing.

split mode (each sample once per epoch, across all ranks):
    The epoch's shard order is a permutation seeded by (seed, epoch): the same on every rank, a
    new one each epoch (shuffle=False keeps list order). The shards' samples, in that order, form
    one sequence of N samples. Each rank gets n = N // world_size samples (remainder="drop": the
    last N % world_size samples of the sequence are skipped; they change with the order) or
    n = ceil(N / world_size) (remainder="wrap": the sequence wraps round, so the first
    (-N % world_size) samples appear twice). Rank r reads positions [r*n, (r+1)*n), cut at sample
    boundaries, so ranks are equal even with fewer shards than ranks x workers or very uneven
    shards. Its workers cut that block into contiguous parts whose sizes differ by at most one,
    the larger first: every rank has the same per-worker counts.

resampled mode (with replacement):
    Each (seed, epoch, rank, worker) has its own seeded stream of draws; shard i is drawn with
    probability weight_i / sum(weights). A `Shard.weight` is the shard's own weight: to give a
    whole *source* a weight, split it over the source's shards (`shards_from_sizes` does that
    for nested URL lists), so a source's share of the draws is its weight whatever its number of
    shards. With samples_per_epoch (per rank), each worker draws until its part of that count
    is reached and the last shard is cut short, so ranks and workers get exact, equal counts.
    A shard of unknown size counts as one sample for this stopping rule (at least that many, if
    it is not empty) and is read whole: the caller then caps the stream at `samples_for(...)`.

Resume: see `ShardScheduler.resume_plan` and `_plan.elastic`.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import itertools
import random
from typing import (
    Dict,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Union,
)

from .._base.errors import UsageError
from .shards import SchedulerConfig, Shard, Slice
from .elastic import (
    Range,
    SchedulerState,
    part_bounds,
    ranges_length,
    rank_share,
    rebase_resampled,
    rebase_split,
    take_ranges,
)

__all__ = ["SchedulerState", "ShardScheduler"]


def _rng(*key: object) -> random.Random:
    # A stable hash of the key, not hash(): the same on every rank, process and Python version.
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "little"))


def _check_layout(rank: int, world_size: int, worker: int, num_workers: int) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise UsageError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    if num_workers < 1 or not 0 <= worker < num_workers:
        raise UsageError(f"need 0 <= worker < num_workers, got worker={worker}, num_workers={num_workers}")


class ShardScheduler:
    """Plans what each (epoch, rank, worker) reads, and keeps the resume state of an epoch.

    The planning methods are pure. The state (`set_epoch`, `advance`, `state_dict`,
    `load_state_dict`) follows the stage contract shared with the other resumable stages.
    """

    def __init__(self, shards: Sequence[Shard], config: Optional[SchedulerConfig] = None) -> None:
        self.shards: Tuple[Shard, ...] = tuple(shards)
        self.config = config if config is not None else SchedulerConfig()
        self._orders: Dict[int, Tuple[List[int], List[int]]] = {}
        self._sizes = [s.samples for s in self.shards]
        self._samples = [n or 0 for n in self._sizes]
        self._urls = [s.url for s in self.shards]
        weights = [s.weight for s in self.shards]
        self._cum_weights = list(itertools.accumulate(weights))
        if self.config.mode == "resampled" and not (self._cum_weights and self._cum_weights[-1] > 0):
            raise UsageError("resampled mode needs at least one shard with a positive weight")
        known = all(s.samples is not None for s in self.shards)
        # Saved in every state and checked on resume, so a state never meets another shard list.
        self._fingerprint: Dict[str, Optional[int]] = {
            "shards": len(self.shards),
            "samples": sum(s.samples for s in self.shards) if known else None,  # type: ignore[misc]
        }
        self.set_epoch(0)

    # -- split mode -------------------------------------------------------------------------

    def _total(self) -> int:
        total = self._fingerprint["samples"]  # (summed once: a resume plans every old worker's part with it)
        if total is not None:
            return total
        missing = [s.url for s in self.shards if s.samples is None]
        if missing:
            raise UsageError(
                f"split mode needs the sample count of every shard; {len(missing)} unknown "
                f"(first: {missing[0]}). Count them first (sizes.json, .idx, `shardstream index`)."
            )
        return sum(s.samples for s in self.shards)  # type: ignore[misc]

    def order(self, epoch: int) -> List[int]:
        """The epoch's shard order (indices into `shards`), identical on every rank."""
        return list(self._order(epoch)[0])

    def _order(self, epoch: int) -> Tuple[List[int], List[int]]:
        # (passes in several threads may share a scheduler: no read-after-write of the dict)
        kept = self._orders.get(epoch)
        if kept is not None:
            return kept
        order = list(range(len(self.shards)))
        if self.config.shuffle:
            _rng("split", self.config.seed, epoch).shuffle(order)
        # starts[k] = position of the first sample of the k-th shard in the epoch sequence.
        starts = [0, *itertools.accumulate(map(self._samples.__getitem__, order))]
        for old in list(self._orders)[: max(0, len(self._orders) - 3)]:  # a few epochs (current, next) are enough
            self._orders.pop(old, None)
        self._orders[epoch] = (order, starts)
        return order, starts

    def _per_rank(self, world_size: int) -> int:
        total = self._total()
        return -(-total // world_size) if self.config.remainder == "wrap" else total // world_size

    def _slices(self, epoch: int, ranges: Sequence[Range]) -> List[Slice]:
        """Map epoch positions to shard slices, joining pieces that continue the same shard."""
        return list(self._iter_slices(epoch, ranges))

    def _iter_slices(self, epoch: int, ranges: Sequence[Range]) -> Iterator[Slice]:
        """`_slices`, made as they are read: a plan over a million shards never holds them all
        (the garbage collector's full passes over them cost more than making them)."""
        order, starts = self._order(epoch)
        total = starts[-1]
        pending: Optional[Slice] = None
        for lo, hi in ranges:
            while lo < hi:  # (one round of the epoch's sequence at a time: "wrap" goes round again)
                base = lo - lo % total
                stop = min(hi, base + total)
                pieces = self._round_slices(order, starts, lo - base, stop - base)
                first = next(pieces)
                if pending is not None and pending.shard_index == first.shard_index and pending.stop == first.start:
                    pending = dataclasses.replace(pending, stop=first.stop)
                else:
                    if pending is not None:
                        yield pending
                    pending = first
                for piece in pieces:  # (the others are other shards: an order holds each shard once)
                    yield pending
                    pending = piece
                lo = stop
        if pending is not None:
            yield pending

    def _round_slices(self, order: List[int], starts: List[int], lo: int, hi: int) -> Iterator[Slice]:
        """The slices of positions [lo, hi) of one round (0 <= lo < hi <= total)."""
        # (the shard holding a position: the last start at or before it, which skips empty shards)
        first = bisect.bisect_right(starts, lo) - 1
        last = bisect.bisect_right(starts, hi - 1) - 1
        index = order[first]
        yield Slice(self._urls[index], lo - starts[first], (hi if first == last else starts[first + 1]) - starts[first], index)
        if first == last:
            return
        urls, samples = self._urls, self._samples
        yield from (Slice(urls[i], 0, n, i) for i in order[first + 1 : last] if (n := samples[i]))
        index = order[last]
        yield Slice(urls[index], 0, hi - starts[last], index)

    # -- resampled mode ---------------------------------------------------------------------

    def _draws(self, epoch: int, rank: int, worker: int, generation: int = 0) -> Iterator[int]:
        rng = _rng("resampled", self.config.seed, epoch, rank, worker, generation)
        total = self._cum_weights[-1]
        last = max(i for i, s in enumerate(self.shards) if s.weight > 0)
        while True:
            # bisect_right never lands on a zero-weight shard; min() guards a product rounded up to total.
            yield min(bisect.bisect_right(self._cum_weights, rng.random() * total), last)

    def iter_resampled(self, epoch: int, rank: int, worker: int = 0) -> Iterator[Slice]:
        """Endless weighted draws of whole shards for (epoch, rank, worker); `plan` with
        samples_per_epoch takes a prefix of the same draws."""
        for index in self._draws(epoch, rank, worker):
            shard = self.shards[index]
            yield Slice(shard.url, 0, shard.samples, index)

    def iter_exact(self, epoch: int, rank: int, worker: int = 0) -> Iterator[Slice]:
        """Endless whole-shard draws for (epoch, rank, worker) in which every `Shard.source`
        gets its exact share of the samples: the next shard comes from the source furthest
        behind its share (sum of its shards' weights over the total), chosen within that source
        by shard weight, seeded. At every point of the stream a source is ahead of its share by
        at most one of its own shards, and behind it by at most one shard of each other source
        (their excesses). A shard of unknown size counts as the mean known size (1 when no size
        is known)."""
        known = [s.samples for s in self.shards if s.samples is not None]
        default = max(1, round(sum(known) / len(known))) if known else 1
        members: Dict[int, List[int]] = {}
        for i, shard in enumerate(self.shards):
            if shard.weight > 0 and (shard.samples is None or shard.samples > 0):
                members.setdefault(shard.source, []).append(i)
        if not members:
            raise UsageError("every shard that can be drawn is empty")
        rng = _rng("exact", self.config.seed, epoch, rank, worker)
        share = dict.fromkeys(members, 0.0)  # a source's share counts its empty shards' weight too
        for shard in self.shards:
            if shard.source in share:
                share[shard.source] += shard.weight
        cumulative = {src: list(itertools.accumulate(self.shards[i].weight for i in idx)) for src, idx in members.items()}
        order = list(members)
        rng.shuffle(order)  # seeded tie-break: workers do not all start with the same source
        rank_of = {src: k for k, src in enumerate(order)}
        taken = dict.fromkeys(members, 0)
        while True:
            src = min(members, key=lambda s: (taken[s] / share[s], rank_of[s]))
            weights = cumulative[src]
            k = min(bisect.bisect_right(weights, rng.random() * weights[-1]), len(weights) - 1)
            index = members[src][k]
            shard = self.shards[index]
            taken[src] += shard.samples if shard.samples is not None else default
            yield Slice(shard.url, 0, shard.samples, index)

    def _resampled_plan(self, epoch: int, rank: int, worker: int, count: int, generation: int) -> List[Slice]:
        if count and not any(s.weight > 0 and s.samples != 0 for s in self.shards):
            raise UsageError("every shard that can be drawn is empty")
        result: List[Slice] = []
        got = 0
        draws = self._draws(epoch, rank, worker, generation)
        while got < count:
            index = next(draws)
            shard = self.shards[index]
            if shard.samples is None:
                result.append(Slice(shard.url, 0, None, index))
                got += 1
            elif shard.samples:
                take = min(shard.samples, count - got)
                result.append(Slice(shard.url, 0, take, index))
                got += take
        return result

    def _resampled_per_rank(self) -> int:
        if self.config.samples_per_epoch is None:
            raise UsageError("resampled mode without samples_per_epoch is endless: use iter_resampled")
        return self.config.samples_per_epoch

    # -- planning ---------------------------------------------------------------------------

    def samples_per_rank(self, epoch: int, world_size: int) -> int:
        """Samples every rank reads in a fresh epoch (the same on all ranks)."""
        if self.config.mode == "resampled":
            return self._resampled_per_rank()
        return self._per_rank(world_size)

    def samples_for(self, epoch: int, rank: int, world_size: int, worker: int = 0, num_workers: int = 1) -> int:
        """Samples worker `worker` of rank `rank` reads in a fresh epoch."""
        _check_layout(rank, world_size, worker, num_workers)
        start, stop = part_bounds(self.samples_per_rank(epoch, world_size), num_workers, worker)
        return stop - start

    def fresh_state(self, epoch: int, world_size: int, num_workers: int = 1) -> SchedulerState:
        """The state at the start of epoch `epoch` on a layout (nothing delivered)."""
        return SchedulerState.fresh(epoch, world_size, num_workers, **self._fingerprint)

    def plan(self, epoch: int, rank: int, world_size: int, worker: int = 0, num_workers: int = 1) -> List[Slice]:
        """The slices worker `worker` of rank `rank` reads in epoch `epoch`, in reading order."""
        _check_layout(rank, world_size, worker, num_workers)
        return self.resume_plan(self.fresh_state(epoch, world_size, num_workers), rank, world_size, worker, num_workers)

    def iter_plan(self, epoch: int, rank: int, world_size: int, worker: int = 0, num_workers: int = 1) -> Iterator[Slice]:
        """`plan`, made as it is read (split mode)."""
        _check_layout(rank, world_size, worker, num_workers)
        if self.config.mode == "resampled":
            return iter(self.plan(epoch, rank, world_size, worker, num_workers))
        state = self.fresh_state(epoch, world_size, num_workers)
        return self._iter_slices(epoch, self._part(state, rank, world_size, worker, num_workers))

    def shard_plan(self, epoch: int, rank: int, world_size: int, worker: int = 0, num_workers: int = 1) -> List[Slice]:
        """Whole shards, webdataset's way (for shards of unknown size): every world_size-th shard
        of the epoch's order from this rank, then every num_workers-th of those from this worker.
        Ranks get equal shard counts (within one), not equal samples."""
        return list(self.iter_shard_plan(epoch, rank, world_size, worker, num_workers))

    def iter_shard_plan(self, epoch: int, rank: int, world_size: int, worker: int = 0, num_workers: int = 1) -> Iterator[Slice]:
        """`shard_plan`, made as it is read."""
        _check_layout(rank, world_size, worker, num_workers)
        mine = self._order(epoch)[0][rank::world_size][worker::num_workers]
        urls, sizes = self._urls, self._sizes
        return (Slice(urls[i], 0, sizes[i], i) for i in mine)

    def shard_part_ranges(self, epoch: int, rank: int, world_size: int, worker: int = 0, num_workers: int = 1) -> List[Range]:
        """The epoch positions of `shard_plan`'s shards (every size known), in reading order."""
        order, starts = self._order(epoch)
        self._total()  # raises when a size is unknown
        where = {index: k for k, index in enumerate(order)}
        result: List[Range] = []
        for piece in self.shard_plan(epoch, rank, world_size, worker, num_workers):
            k = where[piece.shard_index]
            if starts[k + 1] > starts[k]:
                result.append((starts[k], starts[k + 1]))
        return result

    def rebase(self, state: SchedulerState, world_size: int, num_workers: int = 1) -> SchedulerState:
        """The state that finishes `state`'s epoch on the layout (world_size, num_workers), with
        nothing delivered yet on that layout (an unchanged layout returns `state` itself)."""
        saved = {"shards": state.shards, "samples": state.samples}
        if any(value is not None and value != self._fingerprint[key] for key, value in saved.items()):
            raise UsageError(
                f"the state was saved over {state.shards} shards / {state.samples} samples, "
                f"not this shard list ({len(self.shards)} shards)"
            )
        wrap = self.config.remainder == "wrap"
        if self.config.mode == "resampled":
            return rebase_resampled(state, self._resampled_per_rank(), world_size, num_workers, wrap)
        return rebase_split(state, self._per_rank(state.world_size), world_size, num_workers, wrap)

    def resume_plan(
        self, state: SchedulerState, rank: int, world_size: int, worker: int = 0, num_workers: int = 1
    ) -> List[Slice]:
        """What worker `worker` of rank `rank` still reads this epoch after checkpoint `state`
        (merge the ranks' states first: `SchedulerState.merged`).

        split mode, same layout: each worker continues its own part where it stopped, so the
        epoch's samples are exactly delivered + remaining, each once, and every rank still reads
        samples_per_rank in total. Same world size, new num_workers: each rank re-cuts what it
        has left over its new workers, with the same guarantee. New world size: the undelivered
        samples of all old ranks, in sequence order, are cut into equal contiguous shares, one
        per new rank; with remainder="drop" the last (left % world_size) of them (fewer than
        world_size) are dropped, so delivered + remaining + those = the epoch's samples, each
        once; with "wrap" the first (-left % world_size) undelivered samples are read twice, and
        nothing is lost. New ranks always read equal counts.

        resampled mode, same layout: the worker's draws continue after the delivered samples.
        New layout: the samples still owed by all ranks are shared out equally (remainder as
        above) over fresh seeded streams.
        """
        _check_layout(rank, world_size, worker, num_workers)
        state = self.rebase(state, world_size, num_workers)
        done = state.delivered[rank][worker]
        if self.config.mode == "resampled":
            per_rank = state.quota if state.quota is not None else self._resampled_per_rank()
            start, stop = part_bounds(per_rank, num_workers, worker)
            planned = self._resampled_plan(state.epoch, rank, worker, stop - start, state.generation)
            return _skip(planned, done)
        return self._slices(state.epoch, self._part(state, rank, world_size, worker, num_workers))

    def part_ranges(
        self, state: SchedulerState, rank: int, world_size: int, worker: int = 0, num_workers: int = 1
    ) -> List[Range]:
        """split mode: the epoch positions `resume_plan` gives this worker, as ranges."""
        _check_layout(rank, world_size, worker, num_workers)
        if self.config.mode == "resampled":
            raise UsageError("part_ranges applies to split mode")
        return self._part(self.rebase(state, world_size, num_workers), rank, world_size, worker, num_workers)

    def _part(self, state: SchedulerState, rank: int, world_size: int, worker: int, num_workers: int) -> List[Range]:
        done = state.delivered[rank][worker]
        share = rank_share(state, rank, self._per_rank(world_size))
        start, stop = part_bounds(ranges_length(share), num_workers, worker)
        if done > stop - start:
            raise UsageError(f"rank {rank} worker {worker} delivered {done} of a {stop - start}-sample part")
        return take_ranges(share, start + done, stop)

    # -- resume state (the stage contract) --------------------------------------------------

    @property
    def state(self) -> SchedulerState:
        """A snapshot of the current state."""
        return dataclasses.replace(self._state, delivered=self._delivered)

    def set_epoch(self, epoch: int, world_size: int = 1, num_workers: int = 1) -> None:
        """Start epoch `epoch` on a layout: nothing delivered yet."""
        self._set(SchedulerState.fresh(epoch, world_size, num_workers, **self._fingerprint))

    def _set(self, state: SchedulerState) -> None:
        self._state = state
        # Counters live in plain lists: advance() runs per sample or batch and must stay O(1).
        self._delivered = [list(row) for row in state.delivered]

    def advance(self, rank: int, worker: int = 0, count: int = 1) -> None:
        """Record that worker `worker` of rank `rank` delivered `count` more samples of its plan
        (checked against the part's size when the state is resumed)."""
        if count < 0:
            raise ValueError("count must be >= 0")
        self._delivered[rank][worker] += count

    def state_dict(self) -> Dict[str, object]:
        """This scheduler's state as plain types (JSON-safe); gather it from every rank and
        combine with `SchedulerState.merged` before resuming."""
        return self.state.to_dict()

    def load_state_dict(
        self, state_dict: Union[Mapping[str, object], SchedulerState], *,
        world_size: Optional[int] = None, num_workers: Optional[int] = None,
    ) -> None:
        """Restore a state; with a layout, rebase it first (counters then start from zero on
        that layout, and `resume_plan(self.state, ...)` gives the remaining slices)."""
        state = state_dict if isinstance(state_dict, SchedulerState) else SchedulerState.from_dict(dict(state_dict))
        if world_size is not None or num_workers is not None:
            state = self.rebase(state, world_size or state.world_size, num_workers or state.num_workers)
        self._set(state)


def _skip(slices: List[Slice], count: int) -> List[Slice]:
    """Drop the first `count` samples of a plan (to resume a resampled stream)."""
    result = []
    for item in slices:
        if count and item.stop is None:
            raise UsageError(f"cannot skip samples inside {item.url}: its size is unknown")
        if count and count >= item.stop - item.start:  # type: ignore[operator]
            count -= item.stop - item.start  # type: ignore[operator]
        elif count:
            result.append(dataclasses.replace(item, start=item.start + count))
            count = 0
        else:
            result.append(item)
    if count:
        raise UsageError("the state records more samples delivered than the plan holds")
    return result
