"""torch, lazily: shardstream never imports torch itself unless a feature needs it.

torch costs ~170 MB of memory and a second of start-up; a pipeline that yields numpy arrays does
not need it. Our dataset classes derive from a small stand-in base; torch's `IterableDataset` is
an ABC, so they are registered as its virtual subclasses as soon as `torch.utils.data` is
imported (now, if it already is; else by an import hook), and `DataLoader(dataset)` accepts them.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import threading
from typing import Any, Optional, Tuple, Type

__all__ = [
    "DataLoader",
    "IterableDataset",
    "dataloader_class",
    "is_dataloader",
    "is_iterable_dataset",
    "in_worker",
    "is_tensor",
    "release_workers",
    "torch_if_imported",
    "worker_info",
]


class IterableDataset:
    """Base of shardstream's datasets; a virtual subclass of torch's IterableDataset, with what
    that class gives its subclasses: `a + b` chains (torch's `ChainDataset`), and indexing
    raises NotImplementedError, as torch's `Dataset.__getitem__` does."""

    def __iter__(self):  # pragma: no cover - subclasses override
        raise NotImplementedError

    def __add__(self, other: Any) -> Any:
        from torch.utils.data import ChainDataset

        return ChainDataset([self, other])  # type: ignore[list-item]  # (a virtual subclass)

    def __getitem__(self, index: Any) -> Any:
        raise NotImplementedError("Subclasses of Dataset should implement __getitem__.")


_lock = threading.Lock()
_registered = False


def _register(module: Any) -> None:
    global _registered
    with _lock:
        if _registered:
            return
        module.IterableDataset.register(IterableDataset)
        _registered = True


class _Loader(importlib.abc.Loader):
    """Wraps torch.utils.data's loader to register our base right after it executes."""

    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        _register(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "torch.utils.data":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


def _install() -> None:
    data = sys.modules.get("torch.utils.data")
    if data is not None and hasattr(data, "IterableDataset"):
        _register(data)
    else:
        sys.meta_path.insert(0, _Hook())


_install()


def torch_if_imported() -> Optional[Any]:
    """The torch module if something imported it, else None (never imports it)."""
    return sys.modules.get("torch")


def is_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def dataloader_class() -> Optional[Type[Any]]:
    data = sys.modules.get("torch.utils.data")
    return getattr(data, "DataLoader", None) if data is not None else None


def is_dataloader(x: Any) -> bool:
    cls = dataloader_class()
    return cls is not None and isinstance(x, cls)


def is_iterable_dataset(x: Any) -> bool:
    """Whether `x` is a dataset to iterate: shardstream's base, or any subclass of torch's
    IterableDataset (a class that subclasses it has imported torch.utils.data already)."""
    if isinstance(x, IterableDataset):
        return True
    data = sys.modules.get("torch.utils.data")
    cls = getattr(data, "IterableDataset", None) if data is not None else None
    return cls is not None and isinstance(x, cls)


def worker_info() -> Tuple[int, int]:
    """(worker id, number of workers) inside a torch DataLoader worker, else (0, 1)."""
    data = sys.modules.get("torch.utils.data")
    info = data.get_worker_info() if data is not None else None
    return (0, 1) if info is None else (info.id, info.num_workers)


def in_worker() -> bool:
    """Whether this runs in a torch DataLoader worker process."""
    data = sys.modules.get("torch.utils.data")
    return data is not None and data.get_worker_info() is not None


def release_workers(iterator: Any) -> None:
    """Shut a torch DataLoader iterator's worker processes down now, unless they persist.

    torch does so when the iterator ends, not when it raises: its re-raise of a worker's error
    leaves the iterator in a reference cycle (the error's traceback holds the frame that holds
    it), so the workers lived on until a garbage collection, whose finalizer then held whichever
    thread ran it ~5 s per iterator (the queues it signals through were finalized first; an
    event loop answered nothing meanwhile). Not an iterator with workers: nothing to do."""
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if callable(shutdown) and not getattr(iterator, "_persistent_workers", True):
        shutdown()


def DataLoader(*args: Any, **kwargs: Any) -> Any:
    """torch's DataLoader (imports torch)."""
    try:
        from torch.utils.data import DataLoader as TorchDataLoader
    except ModuleNotFoundError as exn:  # pragma: no cover - torch is optional
        raise ModuleNotFoundError("WebLoader needs torch: pip install 'shardstream[torch]'") from exn
    return TorchDataLoader(*args, **kwargs)

