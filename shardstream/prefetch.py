"""Host-to-device prefetch: batches pinned and copied on a side CUDA stream, k batches ahead.

On a machine without CUDA (or for device="cpu") it passes batches through unchanged, so the same
training code runs everywhere.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Deque, Iterable, Iterator, Tuple

__all__ = ["DevicePrefetcher", "to_device"]


def to_device(batch: Any, device: Any, *, pin_memory: bool = True, non_blocking: bool = True) -> Any:
    """Move the tensors (and numpy arrays, as tensors) in a nested batch to `device`."""
    import numpy as np
    import torch

    if isinstance(batch, torch.Tensor):
        if pin_memory and batch.device.type == "cpu" and not batch.is_pinned():
            batch = batch.pin_memory()
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, np.ndarray) and batch.dtype != object:
        return to_device(torch.from_numpy(batch), device, pin_memory=pin_memory, non_blocking=non_blocking)
    if isinstance(batch, dict):
        return {k: to_device(v, device, pin_memory=pin_memory, non_blocking=non_blocking) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(to_device(v, device, pin_memory=pin_memory, non_blocking=non_blocking) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device, pin_memory=pin_memory, non_blocking=non_blocking) for v in batch)
    return batch


def _record_stream(batch: Any, stream: Any) -> None:
    """Tell the caching allocator that `stream` uses these tensors (they were made on another)."""
    import torch

    if isinstance(batch, torch.Tensor):
        batch.record_stream(stream)
    elif isinstance(batch, dict):
        for v in batch.values():
            _record_stream(v, stream)
    elif isinstance(batch, (list, tuple)):
        for v in batch:
            _record_stream(v, stream)


class DevicePrefetcher:
    """Iterate `loader`'s batches on `device`, copying up to `depth` batches ahead.

    Args:
        loader: any iterable of batches (a WebDataset pipeline, a WebLoader, a DataLoader).
        device: target device; CUDA devices get pinned memory and a side stream.
        depth: batches in flight ahead of the consumer.
    """

    def __init__(self, loader: Iterable[Any], device: Any = "cuda", depth: int = 2, pin_memory: bool = True) -> None:
        if depth < 1:
            raise ValueError("depth must be >= 1")
        self.loader = loader
        self.device = device
        self.depth = depth
        self.pin_memory = pin_memory

    def _cuda(self) -> bool:
        import torch

        return torch.device(self.device).type == "cuda" and torch.cuda.is_available()

    def __iter__(self) -> Iterator[Any]:
        if not self._cuda():
            import torch

            device = torch.device(self.device)
            if device.type == "cpu":
                yield from self.loader
                return
            for batch in self.loader:
                yield to_device(batch, device, pin_memory=False, non_blocking=False)
            return
        yield from self._cuda_iter()

    def _cuda_iter(self) -> Iterator[Any]:
        import torch

        device = torch.device(self.device)
        side = torch.cuda.Stream(device=device)
        pending: Deque[Tuple[Any, Any]] = deque()
        source = iter(self.loader)
        try:
            while True:
                while len(pending) < self.depth:
                    try:
                        batch = next(source)
                    except StopIteration:
                        break
                    with torch.cuda.stream(side):
                        moved = to_device(batch, device, pin_memory=self.pin_memory, non_blocking=True)
                        done = torch.cuda.Event()
                        done.record(side)
                    pending.append((moved, done))
                if not pending:
                    return
                moved, done = pending.popleft()
                current = torch.cuda.current_stream(device)
                current.wait_event(done)
                _record_stream(moved, current)
                yield moved
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()
