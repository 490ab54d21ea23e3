"""webdataset's `extradatasets`: MockDataset, and the repeatedly, with_epoch and with_length wrappers."""

from __future__ import annotations

from typing import Any, Iterator, Optional

from ._stages.contract import PipelineStage
from ._base.lazytorch import IterableDataset
from .utils import repeatedly as _repeat

__all__ = ["MockDataset", "repeatedly", "with_epoch", "with_length"]


class MockDataset(IterableDataset):
    """Yield the same sample `length` times."""

    def __init__(self, sample: Any, length: int) -> None:
        self.sample = sample
        self.length = length

    def __iter__(self) -> Iterator[Any]:
        for _ in range(self.length):
            yield self.sample


class repeatedly(IterableDataset, PipelineStage):
    """Iterate a source again and again, up to `nepochs` passes or `nbatches` items in all.

    As a dataset it repeats `source`; as a stage, `run(src)` repeats `src`. `length` is what
    `len()` reports. (webdataset's class never stored `nepochs`, so it could not run.)
    """

    def __init__(self, source: Any, nepochs: Optional[int] = None, nbatches: Optional[int] = None,
                 length: Optional[int] = None) -> None:
        super().__init__()
        self.source = source
        self.nepochs = nepochs
        self.nbatches = nbatches
        self.length = length

    def invoke(self, source: Any) -> Iterator[Any]:
        return _repeat(source, nepochs=self.nepochs, nbatches=self.nbatches)

    def run(self, src: Any) -> Iterator[Any]:
        return self.invoke(src)

    def __iter__(self) -> Iterator[Any]:
        return self.invoke(self.source)

    def __len__(self) -> int:
        if self.length is None:
            raise TypeError("repeatedly has no length unless one is given")
        return self.length


class with_epoch(IterableDataset):
    """Each `iter()` yields `length` samples, continuing the dataset where the last epoch stopped
    and restarting it when it runs out (webdataset's class never ran; this one does)."""

    def __init__(self, dataset: Any, length: int) -> None:
        super().__init__()
        self.dataset = dataset
        self.length = length
        self.source: Optional[Iterator[Any]] = None

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
