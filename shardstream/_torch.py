"""torch is optional: the dataset base classes come from torch when it is installed."""

from __future__ import annotations

__all__ = ["DataLoader", "IterableDataset", "TorchTensor", "have_torch"]

try:
    from torch import Tensor as TorchTensor
    from torch.utils.data import DataLoader, IterableDataset

    have_torch = True
except ModuleNotFoundError:  # pragma: no cover - exercised only without torch
    have_torch = False

    class IterableDataset:  # type: ignore[no-redef]
        """Stand-in base class so pipelines work without torch."""

    class DataLoader:  # type: ignore[no-redef]
        """Stand-in that fails loudly: WebLoader needs torch."""

        def __init__(self, *args, **kwargs):
            raise ModuleNotFoundError("WebLoader needs torch: pip install 'shardstream[torch]'")

    class TorchTensor:  # type: ignore[no-redef]
        """Nothing is an instance of this when torch is missing."""
