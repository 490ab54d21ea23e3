"""The passes of a pipeline as one iterator: repetitions and item limits (with_epoch / repeat),
resume by replay or by position, outputs tagged with their DataLoader worker (for WebLoader's
state), and the pipeline's pass bookkeeping kept through its public methods
(`passes_started`, `begin_pass`, `catch_up_passes`, `note_stats`, `note_progress`, `iterator1`)."""

from __future__ import annotations

from typing import Any, Iterator, List, Optional, Sequence

from .._base.cancel import Stopped, finalize, start_janitor
from .._base.errors import ShardStreamError, UsageError, mark_location
from .._base.lazytorch import in_worker
from .._engine.run import EngineIterator
from .._engine.stats import PipelineStats

__all__ = ["PipelineIterator", "Tagged", "WORKER_END"]


class _WorkerEnd:
    def __reduce__(self):
        return (_worker_end, ())


WORKER_END: Any = _WorkerEnd()


def _worker_end() -> Any:
    return WORKER_END


class Tagged:
    """An item from a DataLoader worker with where it came from (unwrapped by WebLoader): the
    worker, its count of items delivered, its resume position (None: not seekable), and the
    passes its copy of the pipeline had run before this iteration (persistent workers count
    their own: one that wrapped around within `with_epoch` is a pass further on)."""

    __slots__ = ("item", "worker", "count", "position", "pass_base")

    def __init__(self, item: Any, worker: int, count: int, position: Any = None,
                 pass_base: Optional[int] = None) -> None:
        self.item, self.worker, self.count, self.position = item, worker, count, position
        self.pass_base = pass_base

    def __reduce__(self):
        return (Tagged, (self.item, self.worker, self.count, self.position, self.pass_base))

    def replace(self, item: Any) -> "Tagged":
        """The same tag on another item (collated, pinned)."""
        return Tagged(item, self.worker, self.count, self.position, self.pass_base)

    def pin_memory(self) -> "Tagged":
        """The item pinned as torch's DataLoader(pin_memory=True) pins an untagged one (its pin
        thread calls this for any object that has it)."""
        if self.item is WORKER_END:
            return self
        from torch.utils.data._utils.pin_memory import pin_memory

        return self.replace(pin_memory(self.item))


def _close(iterator: Any) -> None:
    close = getattr(iterator, "close", None)
    if close is not None:
        close()


class PipelineIterator:
    """Iterates `repetitions` passes of a pipeline, capped at `limit` items (with_epoch / repeat).

    Besides iteration it offers `stats()` (of the current engine pass) and `close()`.
    """

    def __init__(
        self, pipeline: Any, repetitions: int, limit: Optional[int], skip: int = 0, tag: Optional[int] = None,
        seek: Optional[Sequence[Any]] = None, track: bool = False, resumed: bool = False,
        pass_base: Optional[int] = None,
    ) -> None:
        start_janitor()  # (closes this iterator if it is dropped: see finalize)
        self.serial: Optional[int] = None  # its number among the pipeline's iterations (set by the pipeline)
        self._pipeline = pipeline
        self._skip = skip  # items of a resumed epoch already delivered before the checkpoint
        self._tag = tag  # DataLoader worker id: items go out tagged for WebLoader's state
        self._repetitions = repetitions
        self._limit = limit
        self._passes = 0
        self._count = 0  # items of the current pass
        self._delivered = 0
        self._current: Optional[Iterator[Any]] = None
        self._closed = False  # (close() may come from another thread: no pass starts after it)
        self._last_stats: Optional[PipelineStats] = None
        self._track = track or seek is not None  # keep the resume position of each item
        self._position: Optional[List[Any]] = None
        self._seek: Optional[Sequence[Any]] = None
        self._resumed = resumed or seek is not None  # the first pass continues a saved one
        # Passes the pipeline ran before this iteration: stages that count their own passes
        # (no set_epoch) derive the epoch from it, so a resume in a new process catches up.
        self.pass_base = pipeline.passes_started if pass_base is None else int(pass_base)
        if seek is not None:  # resume by position: [pass, *source position]
            self._passes, self._seek = int(seek[0]), seek[1:]
            self._position = list(seek)
            self._delivered = skip
            self._skip = 0

    def __iter__(self) -> "PipelineIterator":
        return self

    def credit(self, delivered: int) -> None:
        """Count `delivered` items as already handed out (a saved run's, toward the limit)."""
        self._delivered = delivered

    @property
    def delivered(self) -> int:
        """Items delivered so far, including those before the checkpoint on resume."""
        return self._delivered + self._skip  # a replay not yet done still counts

    @property
    def position(self) -> Optional[List[Any]]:
        """Where the last delivered item stands, as [pass, shard item, sample, byte offset]
        (None when the pipeline cannot be resumed by position)."""
        if self._track and self._tag is None and self._current is not None:
            where = self._where()  # read when asked: nothing to do per item
            if where is not None:
                return where
        return self._position

    def __next__(self) -> Any:
        while self._skip:  # resuming: replay the epoch deterministically up to the checkpoint
            try:
                self._next_item()
            except StopIteration:
                raise UsageError(
                    f"the saved state says {self.delivered} items were delivered, but the epoch ends "
                    f"after {self.delivered - self._skip}: it was saved from another dataset or pipeline"
                ) from None
            self._skip -= 1
        if self._tag is None:
            try:
                return self._next_item()
            except ShardStreamError as exn:  # a plain DataLoader's worker: torch keeps only its text
                if in_worker():
                    mark_location(exn)
                raise
        if self._tag < 0:
            raise StopIteration
        try:
            item = self._next_item()
        except StopIteration:
            # Tell WebLoader this worker is done, so it never waits for more from it.
            tag, self._tag = self._tag, -1
            return Tagged(WORKER_END, tag, self._delivered + 1)
        except ShardStreamError as exn:  # leaving a DataLoader worker: torch keeps only its text
            mark_location(exn)
            raise
        return Tagged(item, self._tag, self._delivered, self._position, self.pass_base)

    def _next_item(self) -> Any:
        while True:
            if self._limit is not None and self._delivered >= self._limit:
                if self._resumed:  # resumed at its very end: the saved run had begun this pass
                    self._resumed = False
                    self._pipeline.catch_up_passes(self.pass_base + self._passes + 1)
                self.close()
                raise StopIteration
            if self._current is None:
                if self._passes >= self._repetitions or self._closed:
                    raise StopIteration
                seek, self._seek = self._seek, None
                resumed, self._resumed = self._resumed, False
                self._pipeline.begin_pass(self.pass_base + self._passes, resumed)
                self._current = self._pipeline.iterator1(position=seek, track=self._track, resumed=resumed)
                self._count = 1 if resumed else 0  # a resumed pass may have nothing left
            current = self._current
            if current is None:  # (closed by another thread since the check above)
                raise StopIteration
            try:
                item = next(current)
            except Stopped:
                if self._closed:  # closed from another thread while this one waited for an item
                    raise StopIteration from None
                raise
            except StopIteration:
                if self._closed:
                    raise
                empty = self._count == 0
                self._end_pass()
                self._passes += 1
                if empty:
                    self._passes = self._repetitions
                continue
            if self._closed:  # (a generator that another thread's close() could not stop while it ran)
                _close(current)
                raise StopIteration
            self._count += 1
            self._delivered += 1
            if self._tag is not None and self._track:  # the item leaves the process: note it now
                self._position = self._where() or self._position
            return item

    def _where(self) -> Optional[List[Any]]:
        where = getattr(self._current, "position", None)
        return None if where is None else [self._passes, *where]

    def _end_pass(self) -> None:
        where = self._where() if self._track else None
        if where is not None:
            self._position = where
        current, self._current = self._current, None
        try:
            _close(current)  # first: stages finish their work (the cache's last commits) before the stats
        except ValueError:  # "generator already executing": in the loop's thread, which closes it next
            if not self._closed:
                raise
        if isinstance(current, EngineIterator):
            self._last_stats = current.stats()
            self._pipeline.note_stats(self._last_stats, self.serial)

    def stats(self) -> Optional[PipelineStats]:
        """Stats of the pass under way (or the last one); None when not running on the engine."""
        if isinstance(self._current, EngineIterator):
            return self._current.stats()
        return self._last_stats

    def close(self) -> None:
        """Stop the pass under way and release its threads and files (from any thread: a loop
        waiting for an item ends, with no new pass started)."""
        self._closed = True
        if self._current is not None:
            self._end_pass()  # (before the pass count moves: the position names this pass)
        self._passes = self._repetitions
        # The pipeline keeps the progress: state_dict() after the loop is left still has it.
        self._pipeline.note_progress((self.delivered, self.position, self.pass_base), self.serial)

    def __del__(self) -> None:
        try:
            finalize(self.close)
        except Exception:  # interpreter shutdown
            pass
