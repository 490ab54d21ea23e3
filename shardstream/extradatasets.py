"""webdataset's `extradatasets`: MockDataset, with_epoch and with_length wrappers."""

from __future__ import annotations

from typing import Any, Iterator

from ._stages import PipelineStage
from ._torch import IterableDataset

__all__ = ["MockDataset", "with_epoch", "with_length"]


class MockDataset(IterableDataset):
    """Yield the same sample `length` times."""

    def __init__(self, sample: Any, length: int) -> None:
        self.sample = sample
        self.length = length

    def __iter__(self) -> Iterator[Any]:
        for _ in range(self.length):
            yield self.sample


class with_epoch(IterableDataset):
    """Each `iter()` yields `length` samples, continuing the dataset where the last epoch stopped
    and restarting it when it runs out (webdataset's class never ran; this one does)."""

    def __init__(self, dataset: Any, length: int) -> None:
        super().__init__()
        self.dataset = dataset
        self.length = length
        self.source = None

    def __getstate__(self):
        result = dict(self.__dict__)
        result["source"] = None
        return result

    def __iter__(self) -> Iterator[Any]:
        for _ in range(self.length):
            if self.source is None:
                self.source = iter(self.dataset)
            try:
                sample = next(self.source)
            except StopIteration:
                self.source = iter(self.dataset)
                try:
                    sample = next(self.source)
                except StopIteration:
                    return
            yield sample


class with_length(IterableDataset, PipelineStage):
    """Give a dataset a `__len__` without changing what it yields."""

    def __init__(self, dataset: Any, length: int) -> None:
        super().__init__()
        self.dataset = dataset
        self.length = length

    def __iter__(self) -> Iterator[Any]:
        return iter(self.dataset)

    def run(self, src=None) -> Iterator[Any]:
        return iter(self.dataset if src is None else src)

    def __len__(self) -> int:
        return self.length
