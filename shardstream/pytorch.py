"""webdataset.pytorch: torch's `DataLoader`, `IterableDataset` and `Tensor` (as `TorchTensor`).

webdataset imports torch with the package; here a name is looked up in torch when it is first
asked for, so `import shardstream` stays free of torch. Without torch they are empty stand-in
classes, as in webdataset.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DataLoader", "IterableDataset", "TorchTensor"]


class _IterableDataset:
    """Empty stand-in for torch's IterableDataset when torch is not installed."""


class _DataLoader:
    """Empty stand-in for torch's DataLoader when torch is not installed."""


class _TorchTensor:
    """Empty stand-in for torch.Tensor when torch is not installed."""


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    found: Any
    try:
        import torch
        from torch.utils import data
    except ModuleNotFoundError:
        found = {"DataLoader": _DataLoader, "IterableDataset": _IterableDataset, "TorchTensor": _TorchTensor}[name]
    else:
        found = {"DataLoader": data.DataLoader, "IterableDataset": data.IterableDataset,
                 "TorchTensor": torch.Tensor}[name]
    globals()[name] = found  # (looked up once)
    return found
