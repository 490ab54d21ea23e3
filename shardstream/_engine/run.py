"""The execution engine: a pipeline's stages split into segments and run on background threads.

A *stream segment* (a run of non-sample stages: the shard source, shuffle, batched, user
generators) runs in order in its own thread. A *parallel segment* (a run of `SampleStage`s:
decode, map, to_tuple, ...) is fused into one function and run on the shared thread pool, a
chunk of samples per task. The stream thread before it submits the tasks and puts the futures,
in order, into a bounded channel; the next stage takes them in the same order, so output order
equals a sequential run without any reordering buffer. Unordered mode hands results on as tasks
finish. Channels are bounded, so memory does not grow with shard or dataset size.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

from .channel import END, Channel, Failure, Stopped, payload_bytes
from .config import EngineConfig, available_cores
from .pool import get_pool
from .._base.counters import Counters
from .._base.cancel import finalize, set_stop, start_janitor
from .._base.errors import UsageError, note_stage
from .segments import STOP, Segment, run_task, split_segments, tracked
from .stats import PipelineStats, StageStats

__all__ = ["EngineIterator"]

log = logging.getLogger(__name__)

_TASK_TARGET_S = 0.001  # aim for pool tasks of about this long (chunking amortises overhead)
_CHUNK_TARGET_S = 0.0005  # and for queue chunks that take about this long to produce
_JOIN_TIMEOUT_S = 5.0


class _Run:
    """One pass of a pipeline on the engine: threads, channels, stats; `close()` stops it all."""

    def __init__(
        self, stages: Sequence[Any], invoke: Callable[..., Iterator[Any]], config: EngineConfig,
        pivot: Optional[Tuple[int, Callable[..., Any]]] = None,
    ) -> None:
        self.config = config
        self.invoke = invoke
        # Position tracking: pivot = (stage index, wrap). wrap(stage, src) runs that stage and
        # returns (iterator, where): where() is the position its last output stands at. Every
        # item then travels with a position (the stages after the pivot are clean cuts, so an
        # item's position is that of the last pivot output it depends on).
        self.pivot = pivot
        self.stop = threading.Event()
        self.started = time.perf_counter()
        self.cpu_started = time.process_time()
        self._frozen: Optional[Tuple[float, float]] = None  # (wall, process CPU) when the run ended
        self.threads_n = config.resolved_threads()
        self.pool = get_pool(self.threads_n)
        self.inflight = config.resolved_inflight(self.threads_n)
        self.segments = split_segments(stages)
        self.stage_stats: List[StageStats] = []
        self.channels: List[Channel] = []
        self.workers: List[threading.Thread] = []
        self.delivered = 0
        self.closed = False
        self._raise_next: Optional[BaseException] = None  # a task's error, raised after its chunk's items
        self._last_log = self.started
        self.source_stats = _find_source_stats(stages)
        self.cache = _find_cache(stages)
        self._source_base = self.source_stats.snapshot() if self.source_stats else {}
        self._build()

    def _build(self) -> None:
        upstream: Optional[Channel] = None
        segments = self.segments
        i = 0
        while i < len(segments):
            segment = segments[i]
            parallel = segments[i + 1] if i + 1 < len(segments) else None
            stats = StageStats(segment.name, "stream")
            self.stage_stats.append(stats)
            pstats = None
            if parallel is not None:
                pstats = StageStats(parallel.name, "parallel", self.threads_n)
                self.stage_stats.append(pstats)
                capacity = self.inflight
            else:
                capacity = self.config.queue_chunks
            out = Channel(f"after {segment.name}" if parallel is None else f"{parallel.name} tasks", capacity, self.stop,
                          self.config.queue_bytes if parallel is None else None)
            self.channels.append(out)
            thread = threading.Thread(
                target=self._stream_worker,
                args=(segment, upstream, out, parallel, stats, pstats),
                name=f"shardstream-{segment.name[:40]}",
                daemon=True,
            )
            self.workers.append(thread)
            upstream = out
            i += 2 if parallel is not None else 1
        self.output = upstream
        for thread in self.workers:
            thread.start()

    # ---- producer side -------------------------------------------------------------------
    def _input(self, segment: Segment, upstream: Optional[Channel]) -> Tuple[Iterator[Any], Optional[Callable[[], Any]]]:
        """The segment's composed iterator, and (when positions are tracked) a function giving
        the source position of what it yielded last: for the source's segment the source's own
        position, downstream the position of the last item pulled from the channel (stages are
        clean cuts, so that is where their last output stands)."""
        pivot, wrap = self.pivot if self.pivot is not None else (-1, None)
        where: Optional[Callable[[], Any]] = None
        source: Any = None
        if upstream is not None and segment.start > pivot >= 0:
            cell: List[Any] = [None]
            source = self._items(upstream, cell)
            where = functools.partial(cell.__getitem__, 0)
        elif upstream is not None:
            source = self._items(upstream)
        for index, stage in enumerate(segment.stages, segment.start):
            if index == pivot:
                source, where = wrap(stage, source)  # type: ignore[misc]
            elif index == 0:
                source = self.invoke(stage)
            else:
                source = self.invoke(stage, source)
        return iter(source), where

    def _items(self, channel: Channel, cell: Optional[List[Any]] = None) -> Iterator[Any]:
        """The items in a channel, in order: chunks flattened, futures resolved, STOP honoured;
        with a `cell`, cell[0] is the position of the item last handed out."""
        while True:
            entry = channel.get()
            if entry is END:
                return
            if isinstance(entry, Failure):
                raise entry.exc
            if isinstance(entry, Future):
                entry = self._result(entry, channel)
            positions = getattr(entry, "positions", None) if cell is not None else None
            failure = entry[-1] if entry and type(entry[-1]) is Failure else None  # (a task's last)
            for index, item in enumerate(entry):
                if item is STOP:
                    return
                if item is failure:
                    raise failure.exc  # type: ignore[union-attr]
                if positions is not None:
                    cell[0] = positions[index]  # type: ignore[index]
                yield item

    def _result(self, future: Future, channel: Channel) -> List[Any]:
        if not future.done():
            start = time.perf_counter()
            while True:
                if self.stop.is_set():
                    raise Stopped()
                try:
                    result = future.result(timeout=0.05)
                    break
                except FutureTimeout:
                    continue
            channel.stats.on_get(time.perf_counter() - start)
            return result
        return future.result()

    def _stream_worker(self, segment, upstream, out, parallel, stats, pstats) -> None:
        source = None
        set_stop(self.stop)  # (a stream's wait for the network ends when the run stops)
        try:
            source, where = self._input(segment, upstream)
            if parallel is None:
                self._pump_items(source, out, stats, upstream, where)
            else:
                self._pump_tasks(source, out, stats, upstream, parallel.stages, pstats, where)
            out.put(END)
        except Stopped:
            pass
        except BaseException as exc:  # shipped to the consumer, raised there
            note_stage(exc, segment.name)
            try:
                out.put(Failure(exc))
            except Stopped:
                pass
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                try:
                    close()
                except Exception:  # closing must not hide the real outcome
                    log.debug("error while closing stage %s", segment.name, exc_info=True)

    def _chunks(
        self, source: Iterator[Any], stats: StageStats, upstream: Optional[Channel], limit,
        where: Optional[Callable[[], Any]] = None,
    ) -> Iterator[List[Any]]:
        """Lists of up to `limit()` items from source, timing each list's production (the time
        spent waiting on the upstream channel excluded): one clock read per list, not per item.
        With `where`, each list is a _Chunk holding every item's position."""
        clock = time.perf_counter
        qstats = upstream.stats if upstream is not None else None
        nxt = source.__next__
        while True:
            n = limit()
            chunk: List[Any] = [] if where is None else tracked([], [])
            append = chunk.append
            waited = qstats.get_wait_s if qstats is not None else 0.0
            start = clock()
            try:
                if where is None:
                    while n:
                        append(nxt())
                        n -= 1
                else:
                    mark = chunk.positions.append  # type: ignore[attr-defined]
                    while n:
                        append(nxt())
                        mark(where())
                        n -= 1
            except StopIteration:
                if chunk:
                    stats.record(self._spent(start, qstats, waited), len(chunk))
                    yield chunk
                return
            except Stopped:
                raise
            except BaseException:  # the items before go on first, then the error (as a generator pipeline has it)
                if chunk:
                    stats.record(self._spent(start, qstats, waited), len(chunk))
                    yield chunk
                raise
            stats.record(self._spent(start, qstats, waited), len(chunk))
            yield chunk

    @staticmethod
    def _spent(start: float, qstats, waited: float) -> float:
        spent = time.perf_counter() - start
        if qstats is not None:
            spent -= qstats.get_wait_s - waited
        return max(0.0, spent)

    def _pump_items(self, source, out: Channel, stats: StageStats, upstream, where=None) -> None:
        cap = self.config.max_chunk

        def limit() -> int:
            # Queue chunks that take about _CHUNK_TARGET_S to produce: big enough to amortise the
            # hand-over, small enough that slow items (batches) go on alone.
            per_item = stats.per_item_s()
            if not per_item:
                return 1
            return max(1, min(cap, int(_CHUNK_TARGET_S / per_item)))

        for chunk in self._chunks(source, stats, upstream, limit, where):
            out.put(chunk, payload_bytes(chunk[0]) * len(chunk))

    def _pump_tasks(self, source, out: Channel, stats: StageStats, upstream, stages, pstats: StageStats, where=None) -> None:
        submit, cap = self.pool.submit, self.config.max_chunk
        ordered = self.config.ordered
        slots = threading.Semaphore(self.inflight)
        def limit() -> int:
            # Pool tasks of about _TASK_TARGET_S: one sample per task when decoding is slow.
            per_item = pstats.per_item_s()
            if not per_item:
                return 1
            return max(1, min(cap, int(_TASK_TARGET_S / per_item)))

        def deliver(future: Future) -> None:
            try:
                out.put(future)
            except Stopped:
                pass
            finally:
                slots.release()

        def flush(chunk: List[Any]) -> None:
            if ordered:
                out.put(submit(run_task, stages, chunk, pstats))
                return
            while not slots.acquire(timeout=0.05):
                if self.stop.is_set():
                    raise Stopped()
            submit(run_task, stages, chunk, pstats).add_done_callback(deliver)

        try:
            for chunk in self._chunks(source, stats, upstream, limit, where):
                flush(chunk)
        finally:
            if not ordered:  # every task has called back before END (or the error) goes in
                for _ in range(self.inflight):
                    while not slots.acquire(timeout=0.05):
                        if self.stop.is_set():
                            raise Stopped()

    # ---- consumer side -------------------------------------------------------------------
    def next_chunk(self) -> List[Any]:
        """The next delivered chunk; raises StopIteration at the end, or the shipped exception."""
        if self._raise_next is not None:
            exc, self._raise_next = self._raise_next, None
            self.close()
            raise exc
        if self.closed:
            raise StopIteration
        channel = self.output
        assert channel is not None  # set when the pass starts
        try:
            entry = channel.get()
            if entry is END:
                raise StopIteration
            if isinstance(entry, Failure):
                raise entry.exc
            if isinstance(entry, Future):
                entry = self._result(entry, channel)
        except BaseException:
            self.close()
            raise
        if entry and (entry[-1] is STOP or type(entry[-1]) is Failure):
            positions = getattr(entry, "positions", None)
            if entry[-1] is STOP:
                self.close()
            else:
                self._raise_next = entry[-1].exc  # (after the items before it)
            entry = entry[:-1] if positions is None else tracked(entry[:-1], positions[:-1])
        self.delivered += len(entry)
        if self.config.log_interval is not None:
            now = time.perf_counter()
            if now - self._last_log >= self.config.log_interval:
                self._last_log = now
                log.info("shardstream: %s", self.stats().format().replace("\n", " | "))
        return entry

    def _clocks(self) -> Tuple[float, float]:
        """Seconds since the run started, and the process's CPU seconds in them (frozen at its end)."""
        if self._frozen is not None:
            return self._frozen
        return time.perf_counter() - self.started, time.process_time() - self.cpu_started

    def stats(self) -> PipelineStats:
        wall, cpu = self._clocks()
        source = {}
        if self.source_stats is not None:
            now = self.source_stats.snapshot()
            source = {k: v - self._source_base.get(k, 0) for k, v in now.items()}
        return PipelineStats(
            wall_s=wall,
            delivered=self.delivered,
            stages=[s.snapshot(wall) for s in self.stage_stats],
            queues=[c.stats.snapshot() for c in self.channels],
            source=source,
            cache=self.cache.stats() if self.cache is not None else {},
            consumer_wait_s=self.output.stats.get_wait_s if self.output is not None else 0.0,
            cpu_s=cpu,
            cores=available_cores(),
        )

    def close(self) -> None:
        """Stop every thread of this run and cancel queued tasks; safe to call repeatedly."""
        if self.closed:
            return
        self.closed = True
        self._frozen = self._clocks()
        self.stop.set()
        for channel in self.channels:
            for entry in channel.drain():
                if isinstance(entry, Future):
                    entry.cancel()
        current = threading.current_thread()
        for thread in self.workers:
            if thread is not current:
                thread.join(_JOIN_TIMEOUT_S)


def _find_source_stats(stages: Sequence[Any]) -> Optional[Counters]:
    for stage in stages:
        stats = getattr(stage, "source_stats", None)
        if isinstance(stats, Counters):
            return stats
    return None


def _find_cache(stages: Sequence[Any]) -> Any:
    for stage in stages:
        cache = getattr(stage, "cache", None)
        if cache is not None and hasattr(cache, "stats"):
            return cache
    return None


class EngineIterator:
    """The consumer's end of an engine run: an iterator with `stats()` and `close()`; with a
    `pivot`, `position` is the position of the item last returned (see `_Run`)."""

    def __init__(
        self, stages: Sequence[Any], invoke: Callable[..., Iterator[Any]], config: EngineConfig,
        pivot: Optional[Tuple[int, Callable[..., Any]]] = None,
    ) -> None:
        start_janitor()  # (closes this run if the iterator is dropped: see finalize)
        self._run = _Run(stages, invoke, config, pivot)
        self._chunk: List[Any] = []
        self._index = 0
        self._pid = os.getpid()

    @property
    def position(self) -> Any:
        positions = getattr(self._chunk, "positions", None)
        if positions is None or not self._index:
            return None
        return positions[self._index - 1]

    def __iter__(self) -> "EngineIterator":
        return self

    def __next__(self) -> Any:
        chunk, index = self._chunk, self._index
        if index >= len(chunk):
            if os.getpid() != self._pid:  # (its threads are the parent's: nothing would ever come)
                raise UsageError("an iterator started before fork cannot go on in the child: start a new one "
                                 "there (iter(dataset))")
            while True:
                chunk = self._run.next_chunk()
                if chunk:
                    break
            self._chunk = chunk
            index = 0
        self._index = index + 1
        return chunk[index]

    def stats(self) -> PipelineStats:
        return self._run.stats()

    def close(self) -> None:
        self._run.close()

    def __del__(self) -> None:
        try:
            finalize(self._run.close)
        except Exception:  # interpreter shutdown
            pass
