"""webdataset's `DataPipeline`: a list of stages, run on the engine (or as nested generators)."""

from __future__ import annotations

import copy
import sys
import warnings
from typing import Any, Iterator, List, Optional

from ._config import EngineConfig, engine_defaults
from ._engine import EngineIterator
from ._stages import PipelineStage
from ._stats import PipelineStats
from ._torch import IterableDataset, is_dataloader

__all__ = ["DataPipeline", "PipelineIterator", "add_length_method"]


def add_length_method(obj):
    """Give `obj` a `__len__` returning obj.size (webdataset's with_length)."""

    def length(self):
        return self.size

    Combined = type(obj.__class__.__name__ + "_Length", (obj.__class__, IterableDataset), {"__len__": length})
    obj.__class__ = Combined
    return obj


class PipelineIterator:
    """Iterates `repetitions` passes of a pipeline, capped at `limit` items (with_epoch / repeat).

    Besides iteration it offers `stats()` (of the current engine pass) and `close()`.
    """

    def __init__(self, pipeline: "DataPipeline", repetitions: int, limit: Optional[int]) -> None:
        self._pipeline = pipeline
        self._repetitions = repetitions
        self._limit = limit
        self._passes = 0
        self._count = 0  # items of the current pass
        self._delivered = 0
        self._current: Optional[Iterator[Any]] = None
        self._last_stats: Optional[PipelineStats] = None

    def __iter__(self) -> "PipelineIterator":
        return self

    def __next__(self) -> Any:
        while True:
            if self._limit is not None and self._delivered >= self._limit:
                self.close()
                raise StopIteration
            if self._current is None:
                if self._passes >= self._repetitions:
                    raise StopIteration
                self._current = self._pipeline.iterator1()
                self._count = 0
            try:
                item = next(self._current)
            except StopIteration:
                empty = self._count == 0
                self._end_pass()
                self._passes += 1
                if empty:
                    self._passes = self._repetitions
                continue
            self._count += 1
            self._delivered += 1
            return item

    def _end_pass(self) -> None:
        current, self._current = self._current, None
        if isinstance(current, EngineIterator):
            self._last_stats = current.stats()
            self._pipeline._last_stats = self._last_stats
        close = getattr(current, "close", None)
        if close is not None:
            close()

    def stats(self) -> Optional[PipelineStats]:
        """Stats of the pass under way (or the last one); None when not running on the engine."""
        if isinstance(self._current, EngineIterator):
            return self._current.stats()
        return self._last_stats

    def close(self) -> None:
        """Stop the pass under way and release its threads and files."""
        if self._current is not None:
            self._end_pass()
        self._passes = self._repetitions

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass


class DataPipeline(IterableDataset, PipelineStage):
    """A pipeline: the first stage is a source, each later one maps an iterator to an iterator.

    Stages may be iterables/datasets (sources), `PipelineStage`s (run via `.run(src)`), lists
    (flattened into the pipeline) or plain callables `f(src)`; None arguments are skipped.
    Iterating runs the stages on the engine (see `with_engine`).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        self.pipeline: List[Any] = []
        self.length = -1
        self.repetitions = 1
        self.nsamples = -1
        self.engine_config: Optional[EngineConfig] = None
        self._last_stats: Optional[PipelineStats] = None
        for arg in args:
            if arg is None:
                continue
            if isinstance(arg, list):
                self.pipeline.extend(arg)
            else:
                self.pipeline.append(arg)

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_last_stats"] = None
        return state

    def close(self) -> None:
        for step in self.pipeline:
            if hasattr(step, "close"):
                step.close()
        del self.pipeline

    def invoke(self, f: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
        if (isinstance(f, IterableDataset) or is_dataloader(f)) and len(args) == 0:
            return iter(f)
        if isinstance(f, PipelineStage):
            return f.run(*args, **kwargs)
        if isinstance(f, list):
            return iter(f)
        if callable(f):
            return f(*args, **kwargs)
        raise ValueError(f"{f}: not a valid pipeline stage")

    def with_engine(self, **options: Any) -> "DataPipeline":
        """A copy that runs with these engine options (see EngineConfig), e.g. threads=8, ordered=False."""
        result = copy.copy(self)
        result.engine_config = (self.engine_config or engine_defaults()).replace(**options)
        return result

    def resolved_engine_config(self) -> EngineConfig:
        return self.engine_config or engine_defaults()

    def _use_engine(self, config: EngineConfig) -> bool:
        if not config.enabled or len(self.pipeline) < 2:
            return False
        # A DataLoader source forks worker processes; keep it in the caller's thread (forking
        # while other threads hold locks is unsafe) and let its workers do the parallel work.
        return not is_dataloader(self.pipeline[0])

    def iterator1(self) -> Iterator[Any]:
        """One pass through the pipeline."""
        config = self.resolved_engine_config()
        if self._use_engine(config):
            return EngineIterator(self.pipeline, self.invoke, config)
        source = self.invoke(self.pipeline[0])
        for step in self.pipeline[1:]:
            source = self.invoke(step, source)
        return source

    def iterator(self) -> Iterator[Any]:
        """`repetitions` passes; stops early when a pass yields nothing."""
        return PipelineIterator(self, self.repetitions, None)

    def __iter__(self) -> Iterator[Any]:
        limit = self.nsamples if self.repetitions != 1 and self.nsamples > 0 else None
        return PipelineIterator(self, self.repetitions, limit)

    def stats(self) -> Optional[PipelineStats]:
        """Stats of this pipeline's most recent finished engine pass (None if none yet)."""
        return self._last_stats

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
