"""webdataset's `mix`: RoundRobin and RandomMix over several datasets."""

from __future__ import annotations

import random
from typing import Any, Iterator, List, Optional

import numpy as np

from ._base.lazytorch import IterableDataset
from ._resume.statecheck import fingerprint
from ._stages.resumable import ResumeTraits

__all__ = ["RandomMix", "RoundRobin", "exact_samples", "random_samples", "round_robin_longest", "round_robin_shortest"]


def round_robin_shortest(*sources: Iterator[Any]) -> Iterator[Any]:
    i = 0
    while True:
        try:
            sample = next(sources[i % len(sources)])
        except StopIteration:
            return
        yield sample
        i += 1


def round_robin_longest(*sources: Iterator[Any]) -> Iterator[Any]:
    remaining = list(sources)
    i = 0
    while remaining:
        i %= len(remaining)
        try:
            sample = next(remaining[i])
        except StopIteration:
            del remaining[i]
            continue
        i += 1
        yield sample


def _tell_each(datasets, method: str, value: int) -> None:
    """Call `method(value)` on every dataset mixed that has it: `set_epoch` (their shard orders
    and shuffles follow the mix's epoch; a pipeline's set_epoch reaches the stages that have one,
    and a mix is one) and `advance_passes` (a resume in a later automatic epoch lets them count
    the passes before it)."""
    for dataset in datasets:
        call = getattr(dataset, method, None)
        if callable(call):
            call(value)


def _described(datasets) -> List[Any]:
    """What each mixed dataset is, for a saved state's fingerprint: its own fingerprint (shards,
    stages, settings), else its type (a state saved over other datasets must not load)."""
    return [fingerprint(d.pipeline, d.state_settings()) if callable(getattr(d, "state_settings", None))
            else type(d).__name__ for d in datasets]


class RoundRobin(IterableDataset):
    """One sample from each dataset in turn; stops with the shortest unless longest=True."""

    def __init__(self, datasets, longest: bool = False) -> None:
        self.datasets = datasets
        self.longest = longest

    def set_epoch(self, epoch: int) -> None:
        _tell_each(self.datasets, "set_epoch", epoch)

    def advance_passes(self, passes: int) -> None:
        _tell_each(self.datasets, "advance_passes", passes)

    def state_settings(self) -> dict:
        """In a saved state's fingerprint: the datasets mixed, and how."""
        return {"longest": self.longest, "datasets": _described(self.datasets)}

    def __iter__(self) -> Iterator[Any]:
        sources = [iter(d) for d in self.datasets]
        return round_robin_longest(*sources) if self.longest else round_robin_shortest(*sources)


def random_samples(sources: List[Iterator[Any]], probs: Optional[List[float]] = None, longest: bool = False,
                   rng: Optional[random.Random] = None) -> Iterator[Any]:
    probs = [1] * len(sources) if probs is None else list(probs)
    draw = random.random if rng is None else rng.random
    while sources:
        cum = (np.array(probs) / np.sum(probs)).cumsum()
        i = int(np.searchsorted(cum, draw()))
        try:
            yield next(sources[i])
        except StopIteration:
            if not longest:
                return
            del sources[i]
            del probs[i]


def exact_samples(sources: List[Iterator[Any]], probs: Optional[List[float]] = None, longest: bool = False) -> Iterator[Any]:
    """Interleave sources in exact proportions (smooth weighted round robin): after any n items,
    each source has given its share of n rounded, never off by more than one item."""
    weights = [1.0] * len(sources) if probs is None else [float(p) for p in probs]
    credit = [0.0] * len(sources)
    live = list(range(len(sources)))
    while live:
        total = sum(weights[i] for i in live)
        for i in live:
            credit[i] += weights[i]
        pick = max(live, key=lambda i: credit[i])
        credit[pick] -= total
        try:
            yield next(sources[pick])
        except StopIteration:
            if not longest:
                return
            live.remove(pick)


class RandomMix(IterableDataset):
    """Draw each sample from a dataset chosen at random with the given probabilities.

    shardstream extensions: `seed` makes the choice sequence reproducible; `exact=True` replaces
    the random choice by a deterministic interleave with exact proportions.
    """

    def __init__(self, datasets, probs=None, longest: bool = False, seed: Optional[int] = None, exact: bool = False) -> None:
        self.datasets = datasets
        self.probs = probs
        self.longest = longest
        self.seed = seed
        self.exact = exact
        self.epoch: Optional[int] = None

    def set_epoch(self, epoch: int) -> None:
        """The datasets mixed take the epoch, and with a seed the draws follow it too (seeded by
        (seed, epoch) after epoch 0)."""
        self.epoch = epoch
        _tell_each(self.datasets, "set_epoch", epoch)

    def advance_passes(self, passes: int) -> None:
        _tell_each(self.datasets, "advance_passes", passes)

    def state_settings(self) -> dict:
        """In a saved state's fingerprint: the datasets mixed, and how."""
        probs = None if self.probs is None else [float(p) for p in self.probs]
        return {"probs": probs, "longest": self.longest, "seed": self.seed, "exact": self.exact,
                "datasets": _described(self.datasets)}

    @property
    def deterministic(self) -> bool:
        """Whether another run draws the same sequence (a resume relies on it)."""
        return self.exact or self.seed is not None

    @property
    def resume_traits(self) -> ResumeTraits:
        return ResumeTraits(deterministic=self.deterministic)

    def __iter__(self) -> Iterator[Any]:
        sources = [iter(d) for d in self.datasets]
        if self.exact:
            return exact_samples(sources, self.probs, longest=self.longest)
        if self.seed is None:
            rng = None
        elif not self.epoch:
            rng = random.Random(self.seed)
        else:
            rng = random.Random(f"shardstream-mix/{self.seed}/{self.epoch}")
        return random_samples(sources, self.probs, longest=self.longest, rng=rng)
