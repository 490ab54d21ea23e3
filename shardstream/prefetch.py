"""Host-to-device prefetch: a background thread pins batches and copies them on a side CUDA stream, `depth` ahead.

The thread follows the engine's worker skeleton (`_engine.channel`): `depth` credits bound the batches
ready ahead, a stop event ends it, and an exception travels as an item and is raised in the
consumer's thread. On CUDA it pins each batch (page-locked host memory), issues the copies on
its own stream with `non_blocking=True` and records an event; the consumer's stream waits on
that event (no host synchronisation) and every tensor is recorded on the consumer's stream, so
the caching allocator never hands its memory to another allocation while the step still uses
it. The host batch is held until the consumer takes the moved one. Without CUDA (or with
device="cpu") batches pass through unchanged, still prefetched by the thread.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Callable, Dict, Iterable, Iterator, Optional

from ._engine.channel import END, Channel, Failure, Stopped

__all__ = ["DevicePrefetcher", "PrefetchIterator", "to_device"]

_POLL_S = 0.05
_JOIN_S = 5.0


def _map_tensors(fn: Callable[[Any], Any], batch: Any) -> Any:
    """`batch` with fn applied to every tensor and numpy array in it, its structure kept (dicts,
    lists, tuples, namedtuples, dataclasses); other leaves unchanged."""
    import numpy as np
    import torch

    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, np.ndarray):
        return fn(batch) if batch.dtype != object else batch
    if isinstance(batch, dict):
        out = {k: _map_tensors(fn, v) for k, v in batch.items()}
        if type(batch) is not dict:
            try:
                return type(batch)(out)  # OrderedDict and friends
            except TypeError:
                return out
        return out
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(_map_tensors(fn, v) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(_map_tensors(fn, v) for v in batch)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        changes = {f.name: _map_tensors(fn, getattr(batch, f.name)) for f in dataclasses.fields(batch) if f.init}
        return dataclasses.replace(batch, **changes)
    return batch


def to_device(batch: Any, device: Any, *, pin_memory: bool = True, non_blocking: bool = True) -> Any:
    """Move the tensors (and numpy arrays, as tensors) in a nested batch to `device`."""
    import numpy as np
    import torch

    def move(x: Any) -> Any:
        if isinstance(x, np.ndarray):
            x = torch.from_numpy(x)
        if pin_memory and x.device.type == "cpu" and not x.is_pinned():
            x = x.pin_memory()
        return x.to(device, non_blocking=non_blocking)

    return _map_tensors(move, batch)


def _record_stream(batch: Any, stream: Any) -> None:
    """Tell the caching allocator that `stream` uses these tensors (they were made on another)."""
    import torch

    def record(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.is_cuda:
            x.record_stream(stream)
        return x

    _map_tensors(record, batch)


class _CudaMover:
    """Pins and copies on a side stream (background thread); hands over on the consumer's stream."""

    def __init__(self, device: Any, pin_memory: bool) -> None:
        import torch

        self.torch = torch
        device = torch.device(device)
        self.device = torch.device("cuda", torch.cuda.current_device()) if device.index is None else device
        self.pin_memory = pin_memory
        self.stream = torch.cuda.Stream(device=self.device)

    def move(self, batch: Any) -> Any:
        torch = self.torch
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            moved = to_device(batch, self.device, pin_memory=self.pin_memory, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.stream)
        return moved, done, batch  # the host batch lives until the copy is waited for

    def hand_over(self, entry: Any) -> Any:
        moved, done, _host = entry
        current = self.torch.cuda.current_stream(self.device)
        current.wait_event(done)
        _record_stream(moved, current)
        return moved


class _PlainMover:
    """No CUDA: pass through (device "cpu"), or a synchronous move to another device."""

    def __init__(self, device: Any) -> None:
        self.device = device

    def move(self, batch: Any) -> Any:
        if self.device is None:
            return batch
        return to_device(batch, self.device, pin_memory=False, non_blocking=False)

    def hand_over(self, entry: Any) -> Any:
        return entry


class DevicePrefetcher:
    """Iterate `loader`'s batches on `device`, moved `depth` batches ahead by a background thread.

    Args:
        loader: any iterable of batches (a WebDataset pipeline, a SubprocessLoader, a WebLoader,
            a DataLoader).
        device: target device; CUDA devices get pinned memory, a side stream and events.
        depth: batches moved ahead of the consumer (at most this many wait on the device).
        pin_memory: pin host memory before the copy (needed for copies that overlap compute).

    `state_dict()` is the loader's state as of the last batch handed to the consumer (the
    loader's own runs up to `depth` batches ahead); `load_state_dict()` and `set_epoch()` go
    to the loader.
    """

    def __init__(self, loader: Iterable[Any], device: Any = "cuda", depth: int = 2, pin_memory: bool = True) -> None:
        if depth < 1:
            raise ValueError("depth must be >= 1")
        self.loader = loader
        self.device = device
        self.depth = depth
        self.pin_memory = pin_memory
        self._last: Optional["PrefetchIterator"] = None

    def _mover(self) -> Any:
        import torch

        device = torch.device(self.device)
        if device.type == "cuda":
            if torch.cuda.is_available():
                return _CudaMover(device, self.pin_memory)
            return _PlainMover(None)  # no CUDA here: the same code runs on the CPU
        return _PlainMover(None if device.type == "cpu" else device)

    def __iter__(self) -> "PrefetchIterator":
        it = PrefetchIterator(iter(self.loader), self._mover(), self.depth, getattr(self.loader, "state_dict", None))
        self._last = it
        return it

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def state_dict(self) -> Dict[str, Any]:
        if self._last is not None and self._last.state is not None:
            return self._last.state
        return self.loader.state_dict()  # type: ignore[attr-defined]

    def load_state_dict(self, state: Any) -> None:
        self._last = None
        self.loader.load_state_dict(state)  # type: ignore[attr-defined]

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)  # type: ignore[attr-defined]


class _Producer:
    """The background thread's side (it must not refer to the iterator, whose collection stops it)."""

    def __init__(self, source: Iterator[Any], mover: Any, depth: int, snapshot: Optional[Callable[[], Any]]) -> None:
        self.source = source
        self.mover = mover
        self.snapshot = snapshot
        self.stop = threading.Event()
        self.credits = threading.Semaphore(depth)
        self.channel = Channel("device prefetch", depth + 1, self.stop)

    def run(self) -> None:
        source, out, snapshot = self.source, self.channel, self.snapshot
        try:
            while True:
                while not self.credits.acquire(timeout=_POLL_S):
                    if self.stop.is_set():
                        raise Stopped()
                try:
                    batch = next(source)
                except StopIteration:
                    break
                entry = self.mover.move(batch)
                out.put((entry, snapshot() if snapshot is not None else None))
            out.put(END)
        except Stopped:
            pass
        except BaseException as exc:  # shipped to the consumer, raised there
            batch = entry = None  # the traceback keeps this frame: not the last batch with it
            try:
                out.put(Failure(exc))
            except Stopped:
                pass
        finally:
            _close(source)


class PrefetchIterator:
    """One pass of a DevicePrefetcher: the background thread and the batches it has moved."""

    def __init__(self, source: Iterator[Any], mover: Any, depth: int, snapshot: Optional[Callable[[], Any]]) -> None:
        self.state: Optional[Dict[str, Any]] = None  # the loader's state after the last batch handed out
        if snapshot is not None:
            try:
                self.state = snapshot()
            except Exception:  # a loader without state (e.g. a non-shardstream dataset)
                snapshot = None
        self._producer = _Producer(source, mover, depth, snapshot)
        self._closed = False
        self._thread = threading.Thread(target=self._producer.run, name="shardstream-prefetch", daemon=True)
        self._thread.start()

    def __iter__(self) -> "PrefetchIterator":
        return self

    def __next__(self) -> Any:
        if self._closed:
            raise StopIteration
        producer = self._producer
        try:
            entry = producer.channel.get()
        except Stopped:
            raise StopIteration from None
        if entry is END:
            self.close()
            raise StopIteration
        if isinstance(entry, Failure):
            self.close()
            exc, entry = entry.exc, None
            try:
                raise exc
            finally:  # this frame is in exc's traceback: no cycle through its locals
                del exc
        producer.credits.release()
        moved, state = entry
        if state is not None:
            self.state = state
        return producer.mover.hand_over(moved)

    def close(self) -> None:
        """Stop the thread and close the loader's iterator; safe to call repeatedly."""
        if self._closed:
            return
        self._closed = True
        producer = self._producer
        producer.stop.set()
        producer.channel.drain()
        thread = self._thread
        if thread is not threading.current_thread():
            thread.join(_POLL_S * 4)
            if thread.is_alive():  # blocked in the loader: closing its iterator wakes it
                try:
                    _close(producer.source)
                except (ValueError, RuntimeError):  # a generator cannot be closed while it runs
                    pass
                thread.join(_JOIN_S)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass


def _close(source: Any) -> None:
    close = getattr(source, "close", None)
    if close is not None:
        close()
