"""webdataset's `DataPipeline`: a list of stages, run on the engine (or as nested generators).

Why this module is over 400 lines: it is one class, webdataset's surface, and the state that
class keeps (epoch, resume point, pass bookkeeping) is read by its own methods only; the passes
themselves run in `_pipeline/passes.py`, resume arithmetic lives in `_resume/`.
"""

from __future__ import annotations

import copy
import functools
import itertools
import multiprocessing
import operator
import sys
import warnings
import weakref
from multiprocessing.context import get_spawning_popen
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from ._engine.config import EngineConfig, engine_defaults
from ._engine.run import EngineIterator
from ._base.errors import UsageError
from ._resume.positions import compose, pivot_wrapper, resume_pivot
from ._plan.ranks import distributed_rank, inherit_rank, pytorch_worker_info
from ._resume.states import (
    choose_state,
    replay_offsets,
    shared_history,
    unseeded_stages,
    worker_passes,
    worker_view,
)
from ._resume.equal_split import ITEM_SPLIT, SHARD_SPLIT, EqualSplit, check_history, is_shard
from ._resume.statecheck import STATE_FORMAT, check_state, fingerprint
from ._pipeline.epochcell import EpochCell
from ._pipeline.passes import PipelineIterator
from ._stages.contract import PipelineStage
from ._shard.samples import TarShardSamples
from ._stages.resumable import EpochAware, traits
from ._engine.stats import PipelineStats
from ._base.lazytorch import IterableDataset, in_worker, is_dataloader, is_iterable_dataset, worker_info
from .shardlists import SimpleShardList, split_by_node, split_by_worker

__all__ = ["DataPipeline", "add_length_method"]


def add_length_method(obj):
    """Give `obj` a `__len__` returning obj.size (webdataset's with_length)."""

    def length(self):
        return self.size

    Combined = type(obj.__class__.__name__ + "_Length", (obj.__class__, IterableDataset), {"__len__": length})
    obj.__class__ = Combined
    return obj


def _reads_shards(stage: Any) -> bool:
    """A stage of ours that turns shards into members or samples (the shard reader)."""
    return isinstance(stage, TarShardSamples) or getattr(stage, "__module__", None) == "shardstream.tariterators"


def _runs_elsewhere(source: Any) -> bool:
    """A source whose pipeline runs in other processes: a torch DataLoader, a SubprocessLoader."""
    return is_dataloader(source) or traits(source).other_processes


def _process_switches() -> Dict[str, Any]:
    """The switches a pipeline's passes depend on that this process set itself: `allow_pipe`,
    `allow_pickle` (process-wide, not a decoder's own), `set_engine_defaults` and webdataset's
    `enforce_security`. A DataLoader worker started by spawn or forkserver imports the package
    afresh and would run with the defaults (pipe: URLs refused that the user allowed, engine
    settings lost): it takes them from the pipeline it is sent, as it is unpickled (before its
    worker_init_fn), as a forked one inherits them. Only the start of such a worker sends them."""
    from ._base import security
    from ._decode.basic import pickle_switch
    from ._fetch.open import pipe_switch

    return {"pipe": pipe_switch(), "pickle": pickle_switch(), "engine": engine_defaults(), "secure": security.enforced()}


def _set_process_switches(switches: Dict[str, Any]) -> None:
    import dataclasses

    from ._base import security
    from ._decode.basic import allow_pickle
    from ._engine.config import set_engine_defaults
    from ._fetch.open import allow_pipe

    if switches["pipe"] is not None:  # (None: the environment decides, in the worker as here)
        allow_pipe(switches["pipe"])
    if switches["pickle"] is not None:
        allow_pickle(switches["pickle"])
    set_engine_defaults(**dataclasses.asdict(switches["engine"]))
    if switches["secure"]:  # (never turned off: a worker's own WDS_SECURE stands)
        security.enforce(True)


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
        self.epoch: Optional[int] = None
        self._last_stats: Optional[PipelineStats] = None
        self._last_iterator: Any = None
        self._resume: Optional[Dict[str, Any]] = None
        self._split_history: Optional[List[Dict[str, Any]]] = None
        self._progress: Optional[Tuple[int, Any, int]] = None
        self._iterations = 0  # iterations begun in this process (the newest one's progress is the state's)
        self._passes_started = 0  # passes run in this process (see PipelineIterator.pass_base)
        self._tag_outputs = False
        self._epoch_cell: Any = None  # persistent DataLoader workers' copies: the epoch set in the loader's process
        for arg in args:
            if arg is None:
                continue
            if isinstance(arg, list):
                self.pipeline.extend(arg)
            else:
                self.pipeline.append(arg)
        if self.pipeline and isinstance(self.pipeline[0], SimpleShardList):
            # A finite shard list: webdataset's split_by_node becomes the equal-work splitter
            # (the order it receives is kept: shuffle shards before it, as OpenCLIP does).
            self.pipeline = [EqualSplit(shuffle=False) if f is split_by_node else f for f in self.pipeline]

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_last_stats"] = None
        state["_last_iterator"] = None
        # A DataLoader worker started by spawn or forkserver unpickles this outside the rank's
        # process group: it takes the rank from here (a forked one inherits the group itself).
        state["_sender_rank"] = distributed_rank()
        if get_spawning_popen() is not None:  # (a spawn or forkserver worker being started: see _process_switches)
            state["_sender_switches"] = _process_switches()
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        switches = state.pop("_sender_switches", None)
        self.__dict__.update(state)
        if switches is not None and getattr(multiprocessing.current_process(), "_inheriting", False):
            _set_process_switches(switches)  # (before the worker's worker_init_fn, which may change them)

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch for shard order and seeded shuffles (passed to every stage that has
        set_epoch: the equal-work splitter, detshuffle). Without it, each pass is a new epoch."""
        epoch = operator.index(epoch)  # (a numpy int from np.arange: states stay JSON)
        if self._resume is not None and self._resume.get("epoch") not in (None, epoch):
            self._resume = None  # a loaded state of another epoch: this one starts fresh
            self._split_history = None
        self.epoch = epoch
        for stage in self.pipeline:
            if isinstance(stage, EpochAware) and stage is not self:
                stage.set_epoch(epoch)
        if not in_worker():  # (persistent DataLoader workers read it as their next pass starts)
            self.share_epoch().value = epoch

    def state_dict(self) -> Dict[str, Any]:
        """Where the most recent iterator is: {"epoch", "delivered", "position", "passes",
        "layout", "split"}: items handed out, the resume position of the last one (None where
        the pipeline can only replay; see `_resume.positions`), the passes run before this iteration
        (automatic epochs), this process's rank and world size, and the states this epoch was
        resumed from on another layout. Plain JSON-safe data."""
        delivered, position, passes = self.progress()
        return {
            "format": STATE_FORMAT, "fingerprint": fingerprint(self.pipeline, self.state_settings()),
            "epoch": self.epoch, "delivered": delivered, "position": position, "passes": passes,
            "layout": self.layout(1), "split": self._split_history,
        }

    def state_settings(self) -> Dict[str, Any]:
        """What this pipeline's items depend on beyond its stages (in a state's fingerprint):
        `with_epoch` / `repeat`'s length."""
        if self.repetitions == 1 and self.nsamples == -1:
            return {}
        return {"repetitions": self.repetitions, "nsamples": self.nsamples}

    def progress(self) -> Tuple[int, Any, int]:
        """(items delivered, position of the last one, passes before this iteration) of the
        iteration under way, the one just left, or the one loaded and not started yet."""
        if self._resume is not None and "delivered" in self._resume:  # loaded, not iterated yet
            return self._resume["delivered"], self._resume.get("position"), self._resume.get("passes") or 0
        it = self._last_iterator() if self._last_iterator is not None else None
        if it is not None:
            return it.delivered, it.position, it.pass_base
        return self._progress or (0, None, self._passes_started)  # the iterator is gone: its last report

    def load_state_dict(self, state: Any) -> None:
        """The next iteration continues the checkpointed epoch after its delivered items.

        `state` is this pipeline's `state_dict()`, or the list of every rank's (`gather_states`)
        to finish the epoch on another world size (see the README, "Exact and elastic resume").

        Exact for deterministic pipelines (seeded shuffles, the equal-work splitter). With a
        position (pipelines whose stages after the shard reader are maps, filters and batching),
        it seeks: shards finished before the checkpoint are not opened, and the shard it stopped
        in is entered at the byte offset of the next sample (local file, disk-cache hit or HTTP/S3
        Range request; a gzip shard is read from its start or its `.idx`). Otherwise the epoch is
        replayed and the items delivered before the checkpoint are skipped."""
        self.resume_from(state, self.pipeline, "dataset", 1)

    # --- what a loader above (WebLoader) asks of the dataset it wraps --------------------------

    def resume_from(self, state: Any, described: Any, kind: str, num_workers: int) -> Dict[str, Any]:
        """Check `state` (a state of `kind`, "dataset" or "loader", describing `described`), pick
        this rank's part or rebuild one for this layout (elastic), and make the next iteration
        continue it; warn when unseeded stages make the resume inexact. Returns the state loaded."""
        layout = self.layout(num_workers)
        own, history = choose_state(check_state(state, described, kind, self.state_settings(), layout), layout)
        chosen = own if own is not None else self._elastic(history)
        self._load(chosen)
        self._warn_inexact()
        return chosen

    def tagged_copy(self) -> "DataPipeline":
        """A copy whose items go out tagged with their DataLoader worker (WebLoader unwraps them
        and keeps per-worker state); this pipeline keeps handing out plain items."""
        result = copy.copy(self)
        result._tag_outputs = True
        return result

    def forget_resume_point(self) -> None:
        """The resume point has gone to the DataLoader workers (their copies): not again here."""
        self._resume = None

    def _warn_inexact(self) -> None:
        """Warn when the resume just loaded cannot continue the saved epoch exactly."""
        config = self.resolved_engine_config()
        if not config.ordered and self._use_engine(config):
            warnings.warn(
                "resuming a pipeline with unordered engine output (with_engine(ordered=False)): the resumed "
                "epoch skips as many items as were delivered, in another order, so not the same items "
                "(samples may repeat or be missed); use ordered output to resume exactly",
                stacklevel=4,  # the caller of load_state_dict (via resume_from)
            )
        unseeded = unseeded_stages(self.pipeline)
        if getattr(self, "_unseeded_shard_shuffle", False):
            unseeded.insert(0, "shard shuffle")
        if unseeded:
            warnings.warn(
                f"resuming a pipeline with an unseeded {' and '.join(unseeded)}: the resumed epoch does "
                "not continue the saved one exactly (samples may repeat or be missed); seed it "
                "(WebDataset(seed=...), WDS_SEED, shuffle(n, seed=...))",
                stacklevel=4,  # the caller of load_state_dict (via resume_from)
            )

    def _load(self, state: Dict[str, Any]) -> None:
        if state.get("epoch") is not None:
            self.set_epoch(state["epoch"])
        self._resume = dict(state)
        self._split_history = state.get("split")

    def layout(self, num_workers: int) -> Dict[str, Any]:
        """Where this process stands (rank, world size, workers, how split_by_node splits), for states."""
        split = self._equal_split()
        rank, world, _worker, _workers = split._layout() if split is not None else pytorch_worker_info()
        layout: Dict[str, Any] = {"rank": rank, "world_size": world, "num_workers": num_workers}
        if split is not None:
            if split.mode is None:
                self.count_samples()  # decides how the splitter splits (no reads at world size 1)
            if split.mode in (SHARD_SPLIT, ITEM_SPLIT):  # positions count whole shards, or items: say so
                layout["node_split"] = split.mode
        return layout

    def _equal_split(self) -> Optional[EqualSplit]:
        return next((s for s in self.pipeline if isinstance(s, EqualSplit)), None)

    def count_samples(self) -> None:
        """Let the equal-work splitter find its shards' sample counts now, in this process, and
        decide how it splits (see `EqualSplit`). WebLoader calls it before starting workers, so
        they do not each look; with a plain torch DataLoader, call it before creating one."""
        split = self._equal_split()
        if split is None:
            return
        index = self.pipeline.index(split)
        if any(_reads_shards(stage) for stage in self.pipeline[:index]):  # placed after the shard reader
            split.mode = ITEM_SPLIT
            return
        # Copies: stages such as detshuffle count their passes, and this pass is not one.
        items = self.invoke(copy.copy(self.pipeline[0]))
        for stage in self.pipeline[1:index]:
            items = self.invoke(copy.copy(stage), items)
        items = iter(items)
        first = next(items, None)
        if first is not None and not is_shard(first):  # after a shard reader of the user's: nothing to count
            split.mode = ITEM_SPLIT
            getattr(items, "close", lambda: None)()
            return
        split.prepare([item["url"] if isinstance(item, dict) else item for item in itertools.chain([first], items)
                       if item is not None])

    def _elastic(self, history: List[Dict[str, Any]]) -> Dict[str, Any]:
        """The resume state that finishes the saved epoch on this (new) layout."""
        split = self._equal_split()
        if split is None:
            raise UsageError("resuming on another world size or worker count needs split_by_node (the equal-work splitter)")
        self._pivot_replay()  # raises when the pipeline's order cannot be recomputed
        check_history(history)
        return {"epoch": history[0].get("epoch"), "split": shared_history(history), "delivered": 0, "position": None,
                "per_worker": {}, "positions": {}}

    def _pivot_replay(self) -> Optional[Callable[..., List[int]]]:
        """For an elastic resume: None when positions are seeks; for count positions, a function
        recomputing which offsets of a worker's part its shuffle buffer had handed on."""
        split = self._equal_split()
        stages = [s for s in self.pipeline if not traits(s).skip_on_resume]
        index, kind = resume_pivot(stages)
        source = next((i for i, s in enumerate(stages) if traits(s).seekable), None)
        ordered = source is not None and split is not None and all(
            s is split_by_worker for s in stages[stages.index(split) + 1 : source]
        )
        if ordered and kind == "seek":
            return None
        if ordered and source is not None and kind == "count" and index == source + 1 and traits(stages[index]).replayable:
            return functools.partial(replay_offsets, stages[index])
        raise UsageError(
            "resuming on another world size or worker count needs shards read in the splitter's order "
            "(no shard shuffle after split_by_node) and, after the shard reader, either clean-cut stages "
            "only (maps, filters, batching) or one seeded sample shuffle right after it followed by "
            "clean-cut stages; resume on the same layout instead (exact for any deterministic pipeline)"
        )

    def close(self) -> None:
        for step in self.pipeline:
            if hasattr(step, "close"):
                step.close()
        del self.pipeline

    def invoke(self, f: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
        if (is_iterable_dataset(f) or is_dataloader(f)) and len(args) == 0:
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
        if not config.enabled or len(self.pipeline) < 2 or config.crowded_worker():
            return False
        # A DataLoader source forks worker processes; keep it in the caller's thread (forking
        # while other threads hold locks is unsafe) and let its workers do the parallel work.
        # A SubprocessLoader's helper does the work too: a thread here would only add a hop.
        return not _runs_elsewhere(self.pipeline[0])

    def iterator1(
        self, position: Optional[Sequence[Any]] = None, track: bool = False, resumed: bool = False
    ) -> Iterator[Any]:
        """One pass through the pipeline; with `track`, the iterator has the resume `position`
        of its last item (see `_resume.positions`), and `position` resumes a pass at one (`resumed`:
        the pass continues a saved one, also without a position, e.g. after an elastic resume)."""
        config = self.resolved_engine_config()
        engine = self._use_engine(config)
        stages = self.pipeline
        if position is not None or resumed:  # e.g. check_empty: the rest of a resumed pass may be empty
            stages = [s for s in stages if not traits(s).skip_on_resume]
        pivot = None
        if (track or position is not None) and self._trackable(config):
            index, kind = resume_pivot(stages)
            pivot = (index, pivot_wrapper(kind, self.invoke, position))
        elif position is not None:
            raise UsageError("this pipeline cannot resume at a position (unordered engine output)")
        if engine:
            return EngineIterator(stages, self.invoke, config, pivot)
        return compose(stages, self.invoke, pivot)

    def iterator(self) -> Iterator[Any]:
        """`repetitions` passes; stops early when a pass yields nothing."""
        return PipelineIterator(self, self.repetitions, None)

    def share_epoch(self) -> EpochCell:
        """Persistent DataLoader workers keep the copy of this pipeline they got when they started:
        an epoch set later in the loader's process reaches them through a shared cell (-1 while
        none is set), read at the start of each of their passes. Made by the first `set_epoch`
        in the loader's process (so a plain DataLoader's persistent workers follow it), or here."""
        if self._epoch_cell is None:
            self._epoch_cell = EpochCell(-1 if self.epoch is None else self.epoch)
        return self._epoch_cell

    def __iter__(self) -> Iterator[Any]:
        sender = self.__dict__.get("_sender_rank")
        if sender is not None and in_worker():
            inherit_rank(sender)  # (see __getstate__)
        cell = self._epoch_cell
        if cell is not None and in_worker() and cell.value >= 0 and cell.value != self.epoch:
            self.set_epoch(cell.value)  # (in a persistent worker: the epoch its loader was given)
        limit = self.nsamples if self.repetitions != 1 and self.nsamples > 0 else None
        worker, _workers = worker_info()
        skip, seek, resumed, pass_base = 0, None, self._resume is not None, None
        if self._resume is not None:
            counts, positions = worker_view(self._resume)
            skip, seek = counts.get(worker, 0), positions.get(worker)
            if not self._shard_order_reproducible():
                seek = None  # its shard at the saved item may be another one now: replay (not exact, as warned)
            pass_base = worker_passes(self._resume).get(worker, self._resume.get("passes"))
            split = self._equal_split()
            if split is not None:  # plans (and so positions) derive from the states resumed from
                split.history = self._resume.get("split")
                split.replay = self._pivot_replay() if split.history else None
            self._resume = None
        else:
            self._split_history = None  # a fresh epoch
        track = self.seekable()
        it = PipelineIterator(
            self, self.repetitions, limit, skip=skip, tag=worker if self._tag_outputs else None,
            seek=seek if track else None, track=track, resumed=resumed, pass_base=pass_base,
        )
        self._iterations += 1
        it.serial = self._iterations
        self._last_iterator = weakref.ref(it)
        self._progress = None
        return it

    # --- pass bookkeeping: what its iterators and loaders (PipelineIterator, SubprocessLoader)
    # tell the pipeline, so that progress() and state_dict() describe the pass under way.

    @property
    def passes_started(self) -> int:
        """Passes started in this process (stages that count their own passes derive the epoch from it)."""
        return self._passes_started

    def begin_pass(self, target: int, resumed: bool) -> None:
        """Pass number `target` starts; a resumed one first lets the stages count the earlier passes."""
        if resumed:
            self.catch_up_passes(target)
        self._passes_started = target + 1

    def catch_up_passes(self, target: int) -> None:
        """Let the stages count passes up to `target` (a resume that began later than this process)."""
        if target > self._passes_started:
            self.advance_passes(target - self._passes_started)
            self._passes_started = target

    def sync_passes(self, started: int) -> None:
        """Another process ran the passes (SubprocessLoader's helper): take its count."""
        self._passes_started = started

    def note_stats(self, stats: Optional[PipelineStats], serial: Optional[int] = None) -> None:
        if serial is None or serial == self._iterations:
            self._last_stats = stats

    def note_progress(self, progress: Tuple[int, Any, int], serial: Optional[int] = None) -> None:
        """The iterator number `serial` is done: (delivered, position, pass_base) stays for
        state_dict() after the loop, if no iteration began after it (an older iterator closed
        late, e.g. collected in a reference cycle, must not take the state back to its pass)."""
        if serial is None or serial == self._iterations:
            self._progress = progress

    def follow(self, iterator: Any) -> Tuple[int, Any, int]:
        """A pass of a copy of this pipeline runs in another process (SubprocessLoader), and
        `iterator` reports its progress (`delivered`, `position`, `pass_base`) as a
        PipelineIterator does: do what __iter__ does here, bar running, so that progress() and
        state_dict() describe that pass. Returns the progress before its first item."""
        resume = self._resume
        if resume is not None and "delivered" in resume:
            passes = resume.get("passes")
            start = (resume["delivered"], resume.get("position"), self._passes_started if passes is None else int(passes))
        else:
            start = (0, None, self._passes_started)
        if resume is None:
            self._split_history = None  # a fresh epoch
        self._resume = None
        self._progress = None
        self._iterations += 1
        iterator.serial = self._iterations  # (it says so when it reports its progress: see note_progress)
        self._last_iterator = weakref.ref(iterator)
        return start

    def advance_passes(self, passes: int) -> None:
        """Resuming in pass `passes` of a with_epoch/repeat iteration: let the stages that
        count their own passes (detshuffle, seeded shuffles, the splitter, resampled shards)
        count the earlier ones, by starting each stage on no input that many times (a stage
        with `advance_passes` of its own, a mix of datasets or a pipeline, is asked to)."""
        for _ in range(passes):
            for index, stage in enumerate(self.pipeline):
                if traits(stage).skip_on_resume:
                    continue
                own = getattr(stage, "advance_passes", None)
                if callable(own) and stage is not self:
                    own(1)
                    continue
                try:
                    it = self.invoke(stage) if index == 0 else self.invoke(stage, iter(()))
                    next(iter(it), None)
                    close = getattr(it, "close", None)
                    if close is not None:
                        close()
                except Exception:  # a stage that cannot start on no input has no pass counter to advance
                    pass

    def _trackable(self, config: EngineConfig) -> bool:
        # Unordered output has no position to speak of; a DataLoader source (WebLoader) keeps
        # positions per worker instead.
        return (config.ordered or not self._use_engine(config)) and not _runs_elsewhere(self.pipeline[0])

    def _shard_order_reproducible(self) -> bool:
        """Whether another run puts the same shard at each item of a pass: every stage up to the
        shard reader is seeded (a saved position names an item, a sample and a byte offset in it)."""
        if getattr(self, "_unseeded_shard_shuffle", False):
            return False
        for stage in self.pipeline:
            if not traits(stage).deterministic:
                return False
            if traits(stage).seekable:
                return True
        return True

    def seekable(self) -> bool:
        """Whether a pass can be resumed by position rather than replayed (see `_resume.positions`)."""
        return bool(self.pipeline) and self._trackable(self.resolved_engine_config())

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
