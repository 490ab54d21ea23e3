"""Equal work per rank: `split_by_node` backed by the shard scheduler.

webdataset's `split_by_node` hands every world_size-th *shard* to a rank, so ranks with larger
shards run longer and DDP hangs at the end of an epoch. Here the node splitter reads the sample
counts, asks the scheduler for this (epoch, rank, worker)'s slices of shards, and yields them
as `dict(url, start, stop)`: every rank gets the same number of samples (the < world_size
leftover samples of an epoch are dropped by default), its DataLoader workers split that equally,
and the shard order is reshuffled every epoch, identically on all ranks.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, Iterator, Optional

from ._counts import sample_counts
from ._ranks import pytorch_worker_info
from ._samples import source_url
from ._scheduler import SchedulerConfig, Shard, ShardScheduler
from ._stages import PipelineStage

__all__ = ["EqualSplit", "WORKER_SPLIT"]

WORKER_SPLIT = "worker_split"  # an item already cut for this worker: split_by_worker lets it pass


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

    def set_epoch(self, epoch: int) -> None:
        """Use this epoch number for the next passes (else each pass counts as a new epoch)."""
        self.epoch = epoch

    def run(self, src: Iterable[Any]) -> Iterator[Dict[str, Any]]:
        rank, world, worker, workers = pytorch_worker_info(group=self.group)
        epoch = self.epoch if self.epoch is not None else self.passes
        self.passes += 1
        urls = [source_url(item, False)[0] for item in src]
        if not urls:
            return
        shards = [Shard(url, count) for url, count in zip(urls, sample_counts(urls))]
        plan = ShardScheduler(shards, self.config).plan(epoch, rank, world, worker, workers)
        for piece in plan:
            if piece.stop is None or piece.stop > piece.start:
                yield {"url": piece.url, "start": piece.start, "stop": piece.stop, WORKER_SPLIT: True}

    def __call__(self, src: Iterable[Any]) -> Iterator[Dict[str, Any]]:
        return self.run(src)
