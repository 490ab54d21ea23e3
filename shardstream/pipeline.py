"""webdataset's `DataPipeline`: a list of stages run as a chain of iterators."""

from __future__ import annotations

import copy
import sys
import warnings
from itertools import islice
from typing import Any, Iterator, List

from ._stages import PipelineStage
from ._torch import DataLoader, IterableDataset

__all__ = ["DataPipeline", "add_length_method"]


def add_length_method(obj):
    """Give `obj` a `__len__` returning obj.size (webdataset's with_length)."""

    def length(self):
        return self.size

    Combined = type(obj.__class__.__name__ + "_Length", (obj.__class__, IterableDataset), {"__len__": length})
    obj.__class__ = Combined
    return obj


class DataPipeline(IterableDataset, PipelineStage):
    """A pipeline: the first stage is a source, each later one maps an iterator to an iterator.

    Stages may be iterables/datasets (sources), `PipelineStage`s (run via `.run(src)`), lists
    (flattened into the pipeline) or plain callables `f(src)`; None arguments are skipped.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        self.pipeline: List[Any] = []
        self.length = -1
        self.repetitions = 1
        self.nsamples = -1
        for arg in args:
            if arg is None:
                continue
            if isinstance(arg, list):
                self.pipeline.extend(arg)
            else:
                self.pipeline.append(arg)

    def close(self) -> None:
        for step in self.pipeline:
            if hasattr(step, "close"):
                step.close()
        del self.pipeline

    def invoke(self, f: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
        if isinstance(f, (IterableDataset, DataLoader)) and len(args) == 0:
            return iter(f)
        if isinstance(f, PipelineStage):
            return f.run(*args, **kwargs)
        if isinstance(f, list):
            return iter(f)
        if callable(f):
            return f(*args, **kwargs)
        raise ValueError(f"{f}: not a valid pipeline stage")

    def iterator1(self) -> Iterator[Any]:
        """One pass through the pipeline."""
        source = self.invoke(self.pipeline[0])
        for step in self.pipeline[1:]:
            source = self.invoke(step, source)
        return source

    def iterator(self) -> Iterator[Any]:
        """`repetitions` passes; stops early when a pass yields nothing."""
        for _ in range(self.repetitions):
            count = 0
            for sample in self.iterator1():
                yield sample
                count += 1
            if count == 0:
                break

    def __iter__(self) -> Iterator[Any]:
        if self.repetitions != 1 and self.nsamples > 0:
            return islice(self.iterator(), self.nsamples)
        return self.iterator()

    def stage(self, i: int) -> Any:
        return self.pipeline[i]

    def append(self, f: Any) -> None:
        self.pipeline.append(f)

    def compose(self, *args: Any) -> "DataPipeline":
        """A shallow copy with more stages appended (the original is unchanged)."""
        result = copy.copy(self)
        result.pipeline = copy.copy(result.pipeline)
        for arg in args:
            result.append(arg)
        return result

    def with_length(self, n: int, silent: bool = False) -> "DataPipeline":
        if not silent:
            warnings.warn(
                ".with_length() only sets the value of __len__ for compatibility with some training "
                "environments. It does not change the number of samples in an epoch."
            )
        self.size = n
        return add_length_method(self)

    def with_epoch(self, nsamples: int = -1, nbatches: int = -1) -> "DataPipeline":
        """Make each `iter()` yield exactly nsamples items (per worker), restarting passes as needed."""
        self.repetitions = sys.maxsize
        self.nsamples = max(nsamples, nbatches)
        return self

    def repeat(self, nepochs: int = -1, nbatches: int = -1) -> "DataPipeline":
        """Repeat the pipeline nepochs times (forever if <= 0), optionally capped at nbatches."""
        self.repetitions = nepochs if nepochs > 0 else sys.maxsize
        self.nsamples = nbatches
        return self
