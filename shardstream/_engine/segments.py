"""A pipeline as segments, and the fused task that runs a chunk of samples through a parallel
segment's sample stages on a pool thread (positions tracked beside the samples)."""

from __future__ import annotations

import time
from typing import Any, Callable, List, Optional, Sequence

from .._stages.contract import DROP, STOP, SampleStage, through
from .channel import Failure
from .stats import StageStats

__all__ = ["STOP", "Segment", "run_task", "split_segments", "stage_name", "tracked"]

# A chunk may end in STOP (a handler asked to stop the stream: end it after the items before) or
# in a `Failure` (the items before it are delivered, then its exception raised).


class _Chunk(list):
    """A chunk of items with the source `positions` they stand at (when positions are tracked)."""

    __slots__ = ("positions",)
    positions: Optional[List[Any]]


def tracked(items: List[Any], positions: List[Any]) -> _Chunk:
    chunk = _Chunk(items)
    chunk.positions = positions
    return chunk


class Segment:
    """A run of consecutive stages of one kind."""

    def __init__(self, kind: str, stages: List[Any], start: int = 0) -> None:
        self.kind = kind  # "stream" or "parallel"
        self.stages = stages
        self.start = start  # index of its first stage in the pipeline

    @property
    def name(self) -> str:
        return "+".join(stage_name(s) for s in self.stages)


def stage_name(stage: Any) -> str:
    name = getattr(stage, "name", None)
    if isinstance(name, str):
        return name
    return getattr(stage, "__name__", None) or type(stage).__name__


def split_segments(stages: Sequence[Any]) -> List[Segment]:
    """Group the pipeline into alternating stream and parallel segments (the source is stream)."""
    segments: List[Segment] = []
    for i, stage in enumerate(stages):
        kind = "parallel" if i > 0 and isinstance(stage, SampleStage) else "stream"
        if segments and segments[-1].kind == kind:
            segments[-1].stages.append(stage)
        else:
            segments.append(Segment(kind, [stage], i))
    return segments


def run_task(stages: Sequence[SampleStage], chunk: List[Any], stats: StageStats) -> List[Any]:
    """Run a chunk of samples through fused sample stages (on a pool thread). A sample whose
    handler raises ends the chunk with a `Failure`: the samples before it are delivered first."""
    positions = getattr(chunk, "positions", None)
    out: List[Any] = [] if positions is None else tracked([], [])
    if positions is not None:
        kept = out.positions  # type: ignore[attr-defined]
        appended = out.append

        def append_with_position(item: Any) -> None:  # keep each survivor's position beside it
            kept.append(None if item is STOP or type(item) is Failure else positions[index])
            appended(item)

        append: Callable[[Any], None] = append_with_position
    else:
        append = out.append
    failures = 0

    def failed() -> None:
        nonlocal failures
        failures += 1

    start = time.perf_counter()
    try:
        for index, sample in enumerate(chunk):
            try:
                item = through(stages, sample, failed)
            except Exception as raised:  # a handler's: the samples before it go on first, as in a generator pipeline
                append(Failure(raised))
                return out
            if item is STOP:
                append(STOP)
                return out
            if item is not DROP:
                append(item)
        return out
    finally:
        stats.record(time.perf_counter() - start, len(chunk), failures)


