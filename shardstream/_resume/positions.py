"""Resume positions: where an item of a pass stands, so that a pass can be resumed after it.

A pipeline is cut at its *pivot*: the last stage that is not a clean cut (`ResumeTraits.clean_cut`),
or the shard reader when every stage after it is one. Every item leaving the pivot gets a
position, and the stages after it (maps, filters, batching) hand on the position of the last
pivot output they consumed, which is exactly where a resumed pass must continue.

- Seek pivot: the shard reader (`ResumeTraits.seekable`, TarShardSamples) itself. Position = (shard
  item, samples read of it, byte offset of the next sample). Resuming opens no finished shard
  and enters the current one at that offset.
- Count pivot: any other stage (a shuffle buffer, unbatched, a user generator, a mixing source).
  Position = (outputs of the pivot,). Resuming runs the stages up to the pivot again and drops
  that many of its outputs, without running the stages after it (decode, maps, collation) on
  them: exact for deterministic pipelines, and the costly per-sample work is not redone.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

from .._base.errors import UsageError
from .._stages.contract import SampleStage, run_fused
from .._stages.resumable import traits

__all__ = ["Counted", "InlinePositions", "pivot_wrapper", "resume_pivot"]


def resume_pivot(stages: Sequence[Any]) -> Tuple[int, str]:
    """(index, "seek" or "count") of the stage a pass is cut at."""
    index = len(stages) - 1
    while index > 0 and traits(stages[index]).clean_cut:
        index -= 1
    seek = index > 0 and traits(stages[index]).seekable
    return index, "seek" if seek else "count"


class Counted:
    """An iterator counting what it yields; `skip` items are dropped first (counted too)."""

    __slots__ = ("_it", "_skip", "n")

    def __init__(self, it: Any, skip: int = 0) -> None:
        self._it, self._skip, self.n = iter(it), skip, skip

    def __iter__(self) -> "Counted":
        return self

    def __next__(self) -> Any:
        if self._skip:
            nxt, self._skip = self._it.__next__, 0
            for done in range(self.n):
                try:
                    nxt()
                except StopIteration:
                    raise UsageError(
                        f"the resume position is after item {self.n} of this stage, but it yields {done}: "
                        "the state was saved from another dataset or pipeline"
                    ) from None
        item = next(self._it)
        self.n += 1
        return item

    @property
    def position(self) -> Tuple[int]:
        return (self.n,)

    def close(self) -> None:
        close = getattr(self._it, "close", None)
        if close is not None:
            close()


def pivot_wrapper(
    kind: str, invoke: Callable[..., Iterator[Any]], position: Optional[Sequence[Any]] = None
) -> Callable[[Any, Any], Tuple[Iterator[Any], Callable[[], Any]]]:
    """wrap(stage, src) -> (iterator, where) for the pivot stage (src None: it is the source)."""
    if position is not None and len(position) != (3 if kind == "seek" else 1):
        raise ValueError(f"a {kind} position has {3 if kind == 'seek' else 1} fields, got {list(position)!r}")

    def wrap(stage: Any, src: Any) -> Tuple[Iterator[Any], Callable[[], Any]]:
        if kind == "seek":
            cursor = stage.cursor()
            it = stage.run(src, position=position, cursor=cursor)
            return it, functools.partial(getattr, cursor, "position")
        counted = Counted(invoke(stage) if src is None else invoke(stage, src), int(position[0]) if position else 0)
        return counted, functools.partial(getattr, counted, "position")

    return wrap


class InlinePositions:
    """A pass composed of generators in the caller's thread: the position of its last output is
    the pivot's position when that output came out (the stages after the pivot are clean cuts)."""

    __slots__ = ("_it", "_where", "position")

    def __init__(self, it: Iterator[Any], where: Callable[[], Any]) -> None:
        self._it, self._where, self.position = iter(it), where, None

    def __iter__(self) -> "InlinePositions":
        return self

    def __next__(self) -> Any:
        item = next(self._it)
        self.position = self._where()
        return item

    def close(self) -> None:
        close = getattr(self._it, "close", None)
        if close is not None:
            close()


def compose(stages: List[Any], invoke: Callable[..., Iterator[Any]], pivot: Optional[Tuple[int, Callable]]) -> Iterator[Any]:
    """Stages as nested generators, consecutive sample stages fused into one loop (as the engine
    runs them); with a pivot, an InlinePositions."""
    it: Any = None
    where = None
    index = 0
    while index < len(stages):
        stage = stages[index]
        if pivot is not None and index == pivot[0]:
            it, where = pivot[1](stage, it)
        elif index == 0:
            it = invoke(stage)
        else:
            end = index + 1
            while (isinstance(stage, SampleStage) and end < len(stages) and isinstance(stages[end], SampleStage)
                   and not (pivot is not None and end == pivot[0])):
                end += 1
            it = invoke(stage, it) if end == index + 1 else run_fused(stages[index:end], it)
            index = end
            continue
        index += 1
    return it if where is None else InlinePositions(it, where)
