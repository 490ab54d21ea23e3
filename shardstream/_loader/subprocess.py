"""SubprocessLoader: the whole pipeline in one helper process, its items handed over through shared memory.

Threads make decoding cheap, but they share the GIL with the training loop: a step that runs
Python code (tokenizing, augmenting on the CPU, logging) slows the loader down and is slowed
down by it. Here the pipeline and its engine threads run in one helper process (see `_loader.helper`)
and this process only maps each batch's shared-memory segment and unpickles a small header.

Only the recipe crosses at start-up (the dataset pickles as its stage list; caches as their
configuration). The helper starts with "forkserver" where it exists (a server process forks
each helper: fast after the first), else "spawn"; never "fork", which copies a process that
runs threads. The parent's progress mirrors the helper's item by item, so state_dict(),
load_state_dict() and set_epoch() behave as if the pipeline ran here.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import collections
import pickle
import secrets
import signal
import sys
import threading
import time
import warnings
import weakref
from typing import Any, Dict, Optional, Sequence, Tuple

from .._engine.config import engine_defaults
from .._decode.basic import pickle_allowed
from .._base.errors import ShardStreamError, UsageError, add_note
from .exceptions import exception_from
from .helper import HelperOptions, Report, helper_main, pipeline_of
from .._stages.resumable import ResumeTraits
from .._fetch.open import pipe_allowed
from .._plan.ranks import pytorch_worker_info
from .shm import SegmentReader, decode, recycling, unlink_segment, unlink_segments
from .._base.lazytorch import IterableDataset

__all__ = ["RemoteTraceback", "SubprocessIterator", "SubprocessLoader"]

_STOP_WAIT_S = 3.0  # how long a stopped helper may take to exit before it is terminated
_KILL_WAIT_S = 2.0
_CONTEXTS = ("forkserver", "spawn")


class RemoteTraceback(Exception):
    """The helper's traceback, as the __cause__ of an exception re-raised here."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return "\n\n" + self.text


class SubprocessLoader(IterableDataset):
    """Iterate `dataset` in one helper process; its items arrive here through shared memory.

    Args:
        dataset: a WebDataset / DataPipeline (or any picklable iterable; a torch DataLoader with
            num_workers=0). It is pickled at each `iter()`: its recipe, not its data.
        buffer: items the helper may have ready ahead of this process (bounded memory).
        context: "forkserver" (default where available) or "spawn".
        timeout: seconds to wait for one item before raising (None: wait as long as the helper
            lives; its death is noticed at once either way).
        preload: modules the helper imports first (default: torch, when this process has it).
        recycle: write later items into the shared-memory segments of items this process has
            let go of (Linux; see below). False: a fresh segment per item, freed as soon as it
            is let go of (less /dev/shm at peak when item sizes vary a lot; more CPU time).

    Numpy arrays and CPU tensors anywhere in an item arrive as views of one shared-memory
    segment per item (no pickle copy); the rest of the item is pickled. An error in the helper
    is re-raised here with the helper's traceback; the helper's death is an error, never a hang.
    """

    resume_traits = ResumeTraits(other_processes=True)  # for DataPipeline: a source to iterate in the caller's thread

    def __init__(
        self, dataset: Any, buffer: int = 4, *, context: Optional[str] = None, timeout: Optional[float] = None,
        preload: Optional[Sequence[str]] = None, recycle: bool = True,
    ) -> None:
        refusal = getattr(type(dataset), "subprocess_refusal", None)  # a loader that must not be wrapped says why
        if refusal:
            raise UsageError(refusal)
        if getattr(dataset, "num_workers", 0):
            raise UsageError("SubprocessLoader runs its pipeline with threads in one helper process: num_workers must be 0")
        if buffer < 1:
            raise UsageError(f"buffer must be >= 1, got {buffer}")
        if context is not None and context not in _CONTEXTS:
            raise UsageError(f"context must be one of {_CONTEXTS} (fork is unsafe with threads), got {context!r}")
        if timeout is not None and timeout <= 0:
            raise UsageError("timeout must be positive")
        self.dataset = dataset
        self.buffer = buffer
        self.context = context
        self.timeout = timeout
        self.preload = tuple(preload) if preload is not None else None
        self.recycle = bool(recycle)
        self._pipeline = pipeline_of(dataset)
        _context(context)  # a forkserver starts now: its imports overlap the caller's own set-up

    def __iter__(self) -> "SubprocessIterator":
        return SubprocessIterator(self)

    def recipe(self) -> bytes:
        """What crosses to the helper at each iter(): the pickled dataset."""
        try:
            return pickle.dumps(self.dataset, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exn:
            raise UsageError(
                f"SubprocessLoader sends the dataset to its helper process by pickle, which failed: {exn!r}; "
                "use module-level functions instead of lambdas and closures in the pipeline"
            ) from exn

    def _stateful(self) -> Any:
        if self._pipeline is None:
            raise UsageError("SubprocessLoader state needs a shardstream dataset (a DataPipeline)")
        return self._pipeline

    def state_dict(self) -> Dict[str, Any]:
        """The dataset's state as of the last item this process received (see DataPipeline.state_dict)."""
        return self._stateful().state_dict()

    def load_state_dict(self, state: Any) -> None:
        """The next iteration continues the saved epoch (see DataPipeline.load_state_dict)."""
        self._stateful().load_state_dict(state)

    def set_epoch(self, epoch: int) -> None:
        """Set the dataset's epoch; the next iteration's helper gets it with the recipe."""
        target = self._pipeline if self._pipeline is not None else self.dataset
        if not hasattr(target, "set_epoch"):
            raise UsageError("this dataset has no set_epoch")
        target.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.dataset)


def _context(name: Optional[str]) -> Any:
    methods = multiprocessing.get_all_start_methods()
    name = name or ("forkserver" if "forkserver" in methods else "spawn")
    ctx = multiprocessing.get_context(name)
    if name == "forkserver":
        from multiprocessing import forkserver

        # Takes effect only if the server is not running yet: its helpers then fork with these
        # imported. Starting it returns at once; the server imports in the background.
        modules = ["__main__", "shardstream._loader.subprocess"] + (["torch"] if "torch" in sys.modules else [])
        ctx.set_forkserver_preload(modules)
        forkserver.ensure_running()
    return ctx


def _drain(queue: collections.deque) -> list:
    """Everything in `queue` now (other threads may append meanwhile: those stay)."""
    return [queue.popleft() for _ in range(len(queue))]


class _Link:
    """The parent's end of one helper: process, pipe, and the segments still to clean up.
    Its `shutdown` is the iterator's finalizer, so it must not refer to the iterator."""

    def __init__(self, process: Any, conn: Any, prefix: str, buffer: int) -> None:
        self.process = process
        self.conn = conn
        self.prefix = prefix
        self.buffer = buffer
        self.next_segment = 0  # segments below this one were received
        self.received: set = set()  # names of the segments received (recycled ones keep their names)
        self.done_with: collections.deque = collections.deque()  # recycled segments nothing here views
        self.not_again: collections.deque = collections.deque()  # ... that a forked child may still read
        self.reader = SegmentReader(self.done_with.append, self.not_again.append)
        self.closed = False

    def receive(self, timeout: Optional[float]) -> Any:
        conn, sentinel = self.conn, self.process.sentinel
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                if conn.poll():
                    return conn.recv()
            except (EOFError, OSError):
                raise self._died() from None
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise ShardStreamError(f"SubprocessLoader: no item from the helper process within {timeout} s")
            ready = multiprocessing.connection.wait([conn, sentinel], left)
            if sentinel in ready and conn not in ready:
                raise self._died()

    def _died(self) -> ShardStreamError:
        self.process.join(_KILL_WAIT_S)
        code = self.process.exitcode
        if code is not None and code < 0:
            how = f"was killed by {signal.Signals(-code).name}"
        else:
            how = f"exited with code {code}"
        self.shutdown()
        return ShardStreamError(f"SubprocessLoader: the helper process (pid {self.process.pid}) {how} unexpectedly")

    def taken(self, segment: Optional[str], kept: bool) -> None:
        """A segment received; `kept`: it keeps its name here (recycled), else it was unlinked."""
        if segment is not None:
            self.next_segment = max(self.next_segment, int(segment[len(self.prefix):]) + 1)
            if kept:
                self.received.add(segment)

    def removed(self, names: Sequence[str]) -> None:
        """Segments the helper removed: let go of their mappings here."""
        self.reader.forget(names)
        self.received.difference_update(names)

    def credit(self) -> None:
        """One more item may come; with it, the segments this process is done with go back."""
        names, discards = _drain(self.done_with), _drain(self.not_again)
        try:
            self.conn.send(("credit", names, discards) if names or discards else "credit")
        except OSError:
            pass  # the helper is gone; the next receive says so

    def shutdown(self) -> None:
        """Stop the helper (politely, then by force), and remove segments it left behind."""
        if self.closed:
            return
        self.closed = True
        process = self.process
        try:
            self.conn.send("stop")
        except OSError:
            pass
        process.join(_STOP_WAIT_S)
        if process.exitcode is None:
            process.terminate()
            process.join(_KILL_WAIT_S)
        if process.exitcode is None:
            process.kill()
            process.join(_KILL_WAIT_S)
        # At most `buffer` items were out (credits), each with at most one new segment.
        unlink_segments(self.prefix, self.next_segment, self.next_segment + self.buffer + 1)
        for name in self.received:  # recycled ones keep their names while the helper lives
            unlink_segment(name)
        self.received.clear()
        self.reader.close()
        self.conn.close()


class SubprocessIterator:
    """One pass of a SubprocessLoader: a helper process and the items it sends.

    For a DataPipeline it is also what the pipeline's progress() reads (delivered, position,
    pass_base), like the PipelineIterator of a pass run in this process."""

    def __init__(self, loader: SubprocessLoader) -> None:
        pipeline = loader._pipeline
        if pipeline is not None:
            pipeline.count_samples()  # here, once: the helper gets the decided split
        recipe = loader.recipe()  # a loaded resume point goes with it
        rank, world, _worker, _workers = pytorch_worker_info()
        environ = dict(os.environ)
        if world > 1 and "RANK" not in environ:  # a process group set up without env vars
            environ.update(RANK=str(rank), WORLD_SIZE=str(world))
        preload = loader.preload if loader.preload is not None else (("torch",) if "torch" in sys.modules else ())
        prefix = f"shardstream-{os.getpid()}-{secrets.token_hex(4)}-"
        options = HelperOptions(
            prefix=prefix, buffer=loader.buffer, parent_pid=os.getpid(), environ=environ,
            engine=engine_defaults(), allow_pipe=pipe_allowed(), allow_pickle=pickle_allowed(), preload=preload,
            recycle=loader.recycle and recycling(), log_level=logging.getLogger().getEffectiveLevel(),
            warning_filters=_picklable_filters(),
        )
        ctx = _context(loader.context)
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        process = ctx.Process(target=helper_main, args=(child_conn, recipe, options), name="shardstream-helper", daemon=True)
        process.start()
        child_conn.close()
        self._link = _Link(process, parent_conn, prefix, loader.buffer)
        self._finalizer = weakref.finalize(self, self._link.shutdown)
        self._timeout = loader.timeout
        self._recycle = options.recycle
        self._pipeline = pipeline
        self._report: Report = None
        self._started = pipeline is None
        self._done = False
        # One thread reads the pipe at a time: a checkpoint thread's state_dict() (which waits for
        # the helper's start) took an item the training loop then never got.
        self._receiving = threading.Lock()
        self.pid = process.pid
        self.serial: Optional[int] = None  # its number among the pipeline's iterations (set by follow)
        if pipeline is not None:
            # Until the helper reports: the progress a pass started here would have before its first item.
            self._report = (*pipeline.follow(self), pipeline.passes_started)

    def __iter__(self) -> "SubprocessIterator":
        return self

    def __next__(self) -> Any:
        with self._receiving:
            return self._next()

    def _next(self) -> Any:
        if self._done:
            raise StopIteration
        link = self._link
        try:
            while True:
                message = link.receive(self._timeout)
                kind = message[0]
                if kind in _RELAYED:
                    _RELAYED[kind](message[1])
                    continue
                if kind == "item":
                    _kind, encoded, report, dropped = message
                    link.removed(dropped)
                    link.taken(encoded[0], kept=self._recycle)
                    item = link.reader.decode(encoded) if self._recycle else decode(encoded)
                    link.credit()
                    self._note(report)
                    return item
                if kind == "start":
                    self._note(message[1])
                    self._started = True
                elif kind == "end":
                    self._note(message[1])
                    self.close()
                    raise StopIteration
                else:
                    raise _rebuild(message)
        except BaseException:
            self.close()
            raise

    def _note(self, report: Report) -> None:
        self._report = report
        if report is not None and self._pipeline is not None:
            self._pipeline.sync_passes(report[3])

    def _wait_started(self) -> Report:
        """The report before the first item: wait for the helper to have started its pass."""
        if self._started or self._done:
            return self._report
        with self._receiving:
            return self._start_report()

    def _start_report(self) -> Report:
        while not self._started and not self._done:
            message = self._link.receive(self._timeout)
            if message[0] in _RELAYED:
                _RELAYED[message[0]](message[1])
                continue
            if message[0] != "start":
                raise ShardStreamError(f"SubprocessLoader: expected the helper's start, got {message[0]!r}")
            self._note(message[1])
            self._started = True
        return self._report

    @property
    def delivered(self) -> int:
        report = self._wait_started()
        return report[0] if report else 0

    @property
    def position(self) -> Any:
        report = self._wait_started()
        return report[1] if report else None

    @property
    def pass_base(self) -> int:
        report = self._wait_started()
        return report[2] if report else 0

    def close(self) -> None:
        """Stop the helper process and release its shared memory; safe to call repeatedly."""
        if self._done:
            return
        self._done = True
        self._finalizer()
        if self._pipeline is not None and self._report is not None:
            # what PipelineIterator.close leaves behind: state_dict() after the loop still has it
            self._pipeline.note_progress(tuple(self._report[:3]), self.serial)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass


def _log(fields: Dict[str, Any]) -> None:
    """A log record of the helper, handed to this process's logger of the same name."""
    record = logging.makeLogRecord(fields)
    logger = logging.getLogger(record.name)
    if logger.isEnabledFor(record.levelno):
        logger.handle(record)


def _picklable_filters() -> Tuple[Any, ...]:
    """This process's warning filters, as the helper can take them (a filter that does not
    pickle, a category defined in __main__, is left out)."""
    kept = []
    for entry in warnings.filters:
        try:
            pickle.dumps(entry)
        except Exception:  # noqa: BLE001
            continue
        kept.append(entry)
    return tuple(kept)


_warned: Dict[Any, Any] = {}  # the helpers' warnings' registry: "default" shows each place's once


def _warn(fields: Dict[str, Any]) -> None:
    """A warning of the helper, issued here as if raised where the helper raised it."""
    category: Any = sys.modules.get(fields["module"])
    for name in fields["category"].split("."):
        category = getattr(category, name, None)
    if not (isinstance(category, type) and issubclass(category, Warning)):
        category = UserWarning  # (a class this process has not imported)
    warnings.warn_explicit(fields["message"], category, fields["filename"], fields["lineno"], registry=_warned)


_RELAYED = {"log": _log, "warn": _warn}


def _rebuild(message: Any) -> BaseException:
    """The helper's exception, with its traceback as the cause."""
    _kind, payload, text, type_name, text_short, pid = message
    exc = exception_from(payload)
    if exc is None:
        exc = ShardStreamError(f"{type_name}: {text_short}")
    exc.__cause__ = RemoteTraceback(text)
    add_note(exc, f"shardstream: raised in the SubprocessLoader's helper process (pid {pid})")
    return exc
