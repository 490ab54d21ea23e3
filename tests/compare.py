"""Deep equality for samples and batches from webdataset and shardstream."""

from __future__ import annotations

from typing import Any

import numpy as np


def assert_same(a: Any, b: Any, path: str = "sample") -> None:
    """Assert a and b are equal, recursing into dicts/lists/tuples, arrays, tensors, PIL images."""
    from PIL import Image

    from needs import optional

    torch = optional("torch")

    if isinstance(a, dict):
        assert isinstance(b, dict), f"{path}: {type(a)} vs {type(b)}"
        assert set(a) == set(b), f"{path}: keys {sorted(map(str, a))} vs {sorted(map(str, b))}"
        for k in a:
            assert_same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b), f"{path}: {type(a)} vs {type(b)}"
        assert len(a) == len(b), f"{path}: len {len(a)} vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray), f"{path}: {type(a)} vs {type(b)}"
        assert a.dtype == b.dtype and a.shape == b.shape, f"{path}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        assert np.array_equal(a, b), f"{path}: arrays differ"
    elif torch is not None and isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), f"{path}: {type(a)} vs {type(b)}"
        assert a.dtype == b.dtype and a.shape == b.shape, f"{path}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        assert torch.equal(a, b), f"{path}: tensors differ"
    elif isinstance(a, Image.Image):
        assert isinstance(b, Image.Image), f"{path}: {type(a)} vs {type(b)}"
        assert (a.mode, a.size) == (b.mode, b.size), f"{path}: {a.mode}{a.size} vs {b.mode}{b.size}"
        assert a.tobytes() == b.tobytes(), f"{path}: pixels differ"
    else:
        assert type(a) is type(b), f"{path}: {type(a)} vs {type(b)}"
        assert a == b, f"{path}: {a!r} vs {b!r}"


def assert_same_stream(a: list, b: list) -> None:
    """Two streams: same length, same items in the same order."""
    assert len(a) == len(b), f"stream lengths {len(a)} vs {len(b)}"
    for i, (x, y) in enumerate(zip(a, b)):
        assert_same(x, y, f"item[{i}]")
