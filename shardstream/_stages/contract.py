"""Pipeline stages described as data.

A pipeline is a list of stages. Two kinds matter to the engine:

- `SampleStage`: a pure per-sample function (`apply(sample) -> sample | DROP`) plus an exception
  handler. Runs of consecutive sample stages are fused into one task per sample.
- everything else (`StreamStage`, user generator functions, `PipelineStage.run`): an iterator in,
  an iterator out, run in order.

Every stage is still callable as `stage(source_iterator)` so that code written for webdataset,
which composes stages as nested generators, keeps working.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

from .._base.errors import note_stage
from .._base.handlers import reraise_exception
from .resumable import CLEAN_CUT, clean_cut

__all__ = [
    "DROP",
    "PipelineStage",
    "SampleStage",
    "StreamStage",
    "STOP",
    "clean_cut",
    "run_fused",
    "through",
]


class _Drop:
    """Sentinel: the sample is filtered out (select, map returning None, handler skipped it)."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "DROP"

    def __reduce__(self):
        return (_Drop, ())


DROP: Any = _Drop()
STOP: Any = object()  # a handler asked to stop the stream: end it after the items before


class PipelineStage:
    """webdataset's base class for stages that are run as `stage.run(source)`."""

    def invoke(self, *args, **kw):
        raise NotImplementedError

    def run(self, src: Iterable[Any]) -> Iterator[Any]:  # pragma: no cover - subclasses override
        raise NotImplementedError


class SampleStage(PipelineStage):
    """A stage that maps each sample independently; subclasses implement `apply`.

    `apply` returns the new sample or DROP and may raise; the exception goes to `handler`, which
    keeps webdataset's meaning (True: skip this sample, False: stop the stream, raise: propagate).
    """

    name = "sample"
    resume_traits = CLEAN_CUT  # one sample in, at most one out
    handler: Callable[[BaseException], bool] = staticmethod(reraise_exception)

    def apply(self, sample: Any) -> Any:  # pragma: no cover - subclasses override
        raise NotImplementedError

    def run(self, src: Iterable[Any]) -> Iterator[Any]:
        return run_fused([self], src)

    def __call__(self, src: Iterable[Any]) -> Iterator[Any]:
        return self.run(src)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


def through(stages: Sequence[SampleStage], sample: Any, failed: Optional[Callable[[], None]] = None) -> Any:
    """`sample` through consecutive (fused) sample stages: the result, DROP (a stage dropped it,
    or a handler skipped its error) or STOP (a handler said stop the stream). An error is noted
    with its stage and the sample as it came into the first stage (its key and URL, where a later
    stage sees a tuple), and `failed()` is called; a handler's own exception propagates, noted."""
    item = sample
    for stage in stages:
        try:
            item = stage.apply(item)
        except Exception as exn:
            if isinstance(exn, StopIteration):  # (PEP 479's rule: it would end the pass quietly, samples lost)
                try:
                    raise RuntimeError(f"a function of stage {stage.name!r} raised StopIteration") from exn
                except RuntimeError as error:
                    exn = error
            note_stage(exn, stage.name, sample)
            if failed is not None:
                failed()
            try:
                skip = stage.handler(exn)
            except Exception as raised:
                note_stage(raised, stage.name, sample)
                raise
            return DROP if skip else STOP
        if item is DROP:
            return DROP
    return item


def run_fused(stages: Sequence[SampleStage], src: Iterable[Any]) -> Iterator[Any]:
    """Samples through consecutive sample stages in one loop, as the engine fuses them (the same
    calls, in the same order, as their generators chained; see `through`)."""
    for sample in src:
        item = through(stages, sample)
        if item is STOP:
            return
        if item is not DROP:
            yield item


class StreamStage(PipelineStage):
    """A curried generator function: `StreamStage(f, *args, **kw)(src)` is `f(src, *args, **kw)`.

    This is what `pipelinefilter(f)(*args, **kw)` returns (webdataset's FilterFunction).
    """

    def __init__(self, f: Callable[..., Iterator[Any]], *args: Any, **kw: Any) -> None:
        self.f = f
        self.args = args
        self.kw = kw

    @property
    def name(self) -> str:
        return getattr(self.f, "__name__", type(self.f).__name__).lstrip("_")

    def run(self, src: Iterable[Any]) -> Iterator[Any]:
        return self.f(src, *self.args, **self.kw)

    def __call__(self, src: Iterable[Any]) -> Iterator[Any]:
        return self.f(src, *self.args, **self.kw)

    def __repr__(self) -> str:
        return f"<{self.name} {self.args} {self.kw}>"

    __str__ = __repr__
