"""The SubprocessLoader's helper process: it runs a pipeline (engine threads and all) and hands
every item to its parent through shared memory.

One duplex pipe joins the two. Helper to parent: ("start", report) once the pipeline's iterator
exists, ("item", encoded, report, segments removed) per item, then ("end", report) or ("error", ...);
("log", record fields) and ("warn", warning fields) whenever the pipeline logs or warns. Parent to
helper: "credit" for each item received (the helper runs at most `buffer` items ahead: bounded
credits, as in the engine's channels), ("credit", names, discards) when the parent is also done
with those shared-memory segments (the writer recycles `names` and removes `discards`, which a
child the parent forked may still read), and "stop". A report is the pipeline's
progress, so the parent's state_dict() describes what it received (see pipeline.DataPipeline._follow).

The helper dies with its parent: a listener thread sees the pipe close (or the parent's pid
vanish), removes the segments it made that the parent never took, and exits at once.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import pickle
import signal
import sys
import threading
import traceback
import warnings
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from .._base.errors import UsageError
from .._base.processes import pid_alive
from .._engine.channel import Stopped
from .._engine.config import EngineConfig, set_engine_defaults
from .exceptions import exception_payload
from .shm import SegmentWriter, unlink_segments

__all__ = ["HelperOptions", "Report", "helper_main", "pipeline_of"]

_POLL_S = 0.05
_LISTEN_S = 0.25
_STOP_GRACE_S = 1.0  # after "stop", how long the pipeline may take to close before a hard exit

Report = Optional[Tuple[int, Any, int, int]]  # delivered, position, pass_base, passes started


@dataclass(frozen=True)
class HelperOptions:
    """What the helper needs besides the recipe: the parent's process-wide settings included
    (a forkserver child does not inherit the parent's environment)."""

    prefix: str
    buffer: int
    parent_pid: int
    environ: Dict[str, str]
    engine: EngineConfig
    allow_pipe: bool
    allow_pickle: bool
    preload: Tuple[str, ...] = ()
    recycle: bool = True
    log_level: int = logging.WARNING  # the parent's root level: the records it would handle come over
    warning_filters: Tuple[Any, ...] = ()  # the parent's: the warnings it would show come over, once each


# A log record's fields that travel to the parent (the message formatted, its exception as text).
_RECORD_FIELDS = ("name", "levelno", "levelname", "pathname", "filename", "module", "lineno", "funcName",
                  "created", "msecs", "relativeCreated", "thread", "threadName", "process", "processName")


class _ForwardLogs(logging.Handler):
    """Sends the helper's log records to the parent, which hands them to its own loggers: they go
    where the training process's logging configuration sends its own (a file, a collector),
    not to the helper's stderr."""

    def __init__(self, send: Any) -> None:
        super().__init__()
        self._send = send

    def emit(self, record: logging.LogRecord) -> None:
        try:
            fields: Dict[str, Any] = {k: getattr(record, k, None) for k in _RECORD_FIELDS}
            fields["msg"], fields["args"] = record.getMessage(), None
            if record.exc_info:
                fields["exc_text"] = logging.Formatter().formatException(record.exc_info)
            self._send(("log", fields))
        except Stopped:
            pass
        except Exception:
            self.handleError(record)


class _ForwardWarnings:
    """`warnings.showwarning` in the helper: every warning goes to the parent, which issues it
    again under its own filters (a `warn_and_continue` skip is caught by the training process's
    `warnings` settings, `logging.captureWarnings`, pytest), not printed on the helper's stderr."""

    def __init__(self, send: Any) -> None:
        self._send = send

    def __call__(self, message: Any, category: type, filename: str, lineno: int, file: Any = None,
                 line: Optional[str] = None) -> None:
        try:
            self._send(("warn", {"message": str(message), "module": category.__module__,
                                 "category": category.__qualname__, "filename": filename, "lineno": lineno}))
        except Stopped:
            pass


def pipeline_of(source: Any) -> Any:
    """The DataPipeline whose progress a source reports: itself, or a torch DataLoader's dataset."""
    from ..pipeline import DataPipeline

    if isinstance(source, DataPipeline):
        return source
    dataset = getattr(source, "dataset", None)
    return dataset if isinstance(dataset, DataPipeline) else None


def _report(pipeline: Any) -> Report:
    if pipeline is None:
        return None
    delivered, position, pass_base = pipeline.progress()
    return delivered, position, pass_base, pipeline.passes_started


def helper_main(conn: Any, recipe: bytes, options: HelperOptions) -> None:
    """The helper process's entry point."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it stops us
    os.environ.clear()
    os.environ.update(options.environ)
    from .._decode.basic import allow_pickle
    from .._fetch.open import allow_pipe

    set_engine_defaults(**dataclasses.asdict(options.engine))
    allow_pipe(options.allow_pipe)
    allow_pickle(options.allow_pickle)
    for module in options.preload:
        importlib.import_module(module)
    _one_torch_thread()
    _Helper(conn, options).run(recipe)


def _rebuild(recipe: bytes) -> Any:
    """The dataset from its pickle. A function of the parent's main script that the helper cannot
    find (defined under `if __name__ == "__main__":`, which the helper does not run) is a
    UsageError that says so, not a bare AttributeError from pickle."""
    try:
        return pickle.loads(recipe)
    except AttributeError as exn:
        if "__mp_main__" not in str(exn) and "__main__" not in str(exn):
            raise
        raise UsageError(
            f"SubprocessLoader's helper process cannot rebuild the dataset: {exn}. The helper imports your main "
            "script without running its `if __name__ == \"__main__\":` block, so the functions in the pipeline "
            "must be defined at the top level of a module, outside that block"
        ) from None


def _one_torch_thread() -> None:
    """torch ops in the helper run on one intra-op thread, as in a DataLoader worker: the helper's
    parallelism is its engine's threads, and torch's default (one thread per core) beside the
    training process's own oversubscribes the machine. Called again once the recipe is loaded,
    if that imported torch."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != 1:
        torch.set_num_threads(1)


class _Helper:
    def __init__(self, conn: Any, options: HelperOptions) -> None:
        self.conn = conn
        self.options = options
        self.stop = threading.Event()
        self.credits = threading.Semaphore(options.buffer)
        # Two free segments are enough to reuse one as the parent lets go of one per item, and
        # keep /dev/shm near what fresh segments took (a pool of buffer + 2 held twice that).
        self.writer = SegmentWriter(options.prefix, pool=2 if options.recycle else 0)
        self.segments = threading.Lock()  # held while a segment is made, and by a dying listener
        self.told_to_stop = False
        self.sending = threading.Lock()

    def run(self, recipe: bytes) -> None:
        threading.Thread(target=self._listen, name="shardstream-helper-listener", daemon=True).start()
        root = logging.getLogger()
        root.addHandler(_ForwardLogs(self._send))
        root.setLevel(self.options.log_level)
        # The parent's filters here too: a warning it would show once comes over once (per
        # place: the parent's registry then dedups), one it ignores not at all, one it makes an
        # error is an error in the pipeline, as in one process.
        warnings.filters[:] = list(self.options.warning_filters)  # type: ignore[index]
        getattr(warnings, "_filters_mutated", lambda: None)()  # (the registries see the new filters)
        warnings.showwarning = _ForwardWarnings(self._send)
        try:
            source = _rebuild(recipe)
            _one_torch_thread()
            pipeline = pipeline_of(source)
            if pipeline is not None and pipeline.passes_started:
                # The parent's copy counted these passes; this fresh copy's stages catch up, as
                # they would have in one process.
                pipeline.advance_passes(pipeline.passes_started)
            items = iter(source)
            try:
                self._send(("start", _report(pipeline)))
                for item in items:
                    self._take_credit()
                    with self.segments:
                        if self.stop.is_set():
                            raise Stopped()
                        encoded = self.writer.encode(item)
                    self._send(("item", encoded, _report(pipeline), self.writer.take_dropped()))
            finally:
                close = getattr(items, "close", None)
                if close is not None:
                    close()
            self._send(("end", _report(pipeline)))
        except Stopped:
            pass
        except BaseException as exc:  # shipped to the parent and raised there
            self._send_failure(exc)
        # Stay until the parent has taken everything (it says "stop"), or is gone.
        while not self.stop.wait(_LISTEN_S):
            pass
        if not self.told_to_stop:  # the parent is gone (a send failed): nobody else removes the segments
            self._die()
        with self.segments:  # a dying listener removing segments holds it, and exits the process itself
            pass

    def _send(self, message: Any) -> None:
        try:
            with self.sending:  # (log records come from any thread; every message is plain data by now)
                self.conn.send(message)
        except OSError:  # the parent is gone; the listener ends us
            self.stop.set()
            raise Stopped() from None

    def _send_failure(self, exc: BaseException) -> None:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        payload = exception_payload(exc)
        try:
            self._send(("error", payload, text, type(exc).__name__, str(exc), os.getpid()))
        except Stopped:
            pass

    def _take_credit(self) -> None:
        while not self.credits.acquire(timeout=_POLL_S):
            if self.stop.is_set():
                raise Stopped()

    def _listen(self) -> None:
        conn, parent = self.conn, self.options.parent_pid
        try:
            while True:
                if conn.poll(_LISTEN_S):
                    message = conn.recv()
                    if message == "credit":
                        self.credits.release()
                    elif isinstance(message, tuple) and message[0] == "credit":
                        self.writer.release(message[1])  # before the credit: the next item may reuse them
                        self.writer.discard(message[2])
                        self.credits.release()
                    elif message == "stop":
                        self.told_to_stop = True  # the parent removes the segments it knows
                        break
                elif not pid_alive(parent):
                    self._die()
        except (EOFError, OSError):
            self._die()  # the parent closed the pipe without a word: it died
        self.stop.set()
        deadline = threading.Timer(_STOP_GRACE_S, self._die)  # the pipeline did not close in time
        deadline.daemon = True
        deadline.start()

    def _die(self) -> None:
        """Remove the segments the parent never took and those kept for reuse, and exit now (no
        cleanup can hang). The lock first, `stop` after: set first, it let the main thread return
        and the process exit half-way through the removals (a helper review's SIGKILL loop left
        every pooled segment behind)."""
        self.segments.acquire(timeout=_STOP_GRACE_S)  # no segment is made meanwhile
        self.stop.set()
        made = self.writer.sequence
        unlink_segments(self.options.prefix, max(0, made - self.options.buffer - 1), made)
        self.writer.unlink_all()
        os._exit(0)
