"""What the scheduler works on: shards (URL, sample count, weight, source), slices of them, the
scheduler's configuration, and a shard list built from a sizes.json mapping."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Literal, Mapping, Optional, Sequence, Union

from .urls import shard_name

__all__ = ["SchedulerConfig", "Shard", "Slice", "shards_from_sizes"]


@dataclass(frozen=True)
class Shard:
    """One shard: its URL, its sample count when known (sizes.json, .idx), its draw weight in
    resampled mode and the index of the `::` source it came from."""

    url: str
    samples: Optional[int] = None
    weight: float = 1.0
    source: int = 0

    def __post_init__(self) -> None:
        if self.samples is not None and (not isinstance(self.samples, int) or self.samples < 0):
            raise ValueError(f"samples must be None or an int >= 0, got {self.samples!r} for {self.url}")
        if not (math.isfinite(self.weight) and self.weight >= 0):
            raise ValueError(f"weight must be finite and >= 0, got {self.weight!r} for {self.url}")
        if self.source < 0:
            raise ValueError(f"source must be >= 0, got {self.source}")


@dataclass(frozen=True)
class Slice:
    """Samples [start, stop) of shard number `shard_index` (stop None: to the shard's end)."""

    url: str
    start: int
    stop: Optional[int]
    shard_index: int

    @property
    def count(self) -> Optional[int]:
        """Samples in the slice (None: unknown, the slice runs to the end of the shard)."""
        return None if self.stop is None else self.stop - self.start


@dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    """How the scheduler orders and assigns shards.

    Args:
        seed: seeds the shard order (split) and the draws (resampled); same on every rank.
        shuffle: split mode: permute the shards each epoch (False: list order every epoch).
        mode: "split" (each sample once per epoch) or "resampled" (weighted, with replacement).
        remainder: "drop" or "wrap" when samples do not divide evenly over ranks (see module doc).
        samples_per_epoch: resampled mode: samples per rank per epoch (None: endless streams,
            see `ShardScheduler.iter_resampled`). Not allowed in split mode, where the shards
            themselves make the epoch.
    """

    seed: int = 0
    shuffle: bool = True
    mode: Literal["split", "resampled"] = "split"
    remainder: Literal["drop", "wrap"] = "drop"
    samples_per_epoch: Optional[int] = None

    def __post_init__(self) -> None:
        if not isinstance(self.seed, int):
            raise ValueError(f"seed must be an int, got {self.seed!r}")
        if self.mode not in ("split", "resampled"):
            raise ValueError(f"mode must be 'split' or 'resampled', got {self.mode!r}")
        if self.remainder not in ("drop", "wrap"):
            raise ValueError(f"remainder must be 'drop' or 'wrap', got {self.remainder!r}")
        if self.samples_per_epoch is not None:
            if self.mode == "split":
                raise ValueError("samples_per_epoch applies to mode='resampled' only")
            if self.samples_per_epoch < 0:
                raise ValueError(f"samples_per_epoch must be >= 0, got {self.samples_per_epoch}")



def shards_from_sizes(
    urls: Union[Sequence[str], Sequence[Sequence[str]]],
    sizes: Mapping[str, int],
    weights: Optional[Sequence[float]] = None,
) -> List[Shard]:
    """Build the shard list from URLs and a sizes.json mapping (keys: URL or file name).

    Args:
        urls: a flat list of URLs (one source), or one list of URLs per `::` source.
        sizes: sample counts by URL or by file name (what `shardstream index` writes); a shard
            found under neither gets samples=None.
        weights: flat list: one weight per URL. Nested lists: one weight per source, split
            evenly over the source's shards, so each source's share of resampled draws is its
            weight over the sum whatever its shard count. None: weight 1 per URL.
    """
    nested = bool(urls) and not isinstance(urls[0], str)
    groups: List[Sequence[str]] = list(urls) if nested else [urls]  # type: ignore[list-item]
    if weights is not None and len(weights) != (len(groups) if nested else len(urls)):
        raise ValueError(f"got {len(weights)} weights for {len(groups) if nested else len(urls)} "
                         f"{'sources' if nested else 'URLs'}")
    result = []
    for source, group in enumerate(groups):
        for i, url in enumerate(group):
            samples = sizes.get(url, sizes.get(shard_name(url)))
            if weights is None:
                weight = 1.0
            elif nested:
                weight = weights[source] / len(group)
            else:
                weight = float(weights[i])
            result.append(Shard(url, None if samples is None else int(samples), weight, source))
    return result
