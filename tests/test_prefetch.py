"""The device prefetcher: pass-through on CPU, structure-preserving moves, CUDA when present."""

from __future__ import annotations

import collections
import warnings

import numpy as np
import pytest
import torch

import shardstream as wds
from shardstream.prefetch import DevicePrefetcher, to_device

warnings.filterwarnings("ignore", message=".*shardshuffle.*")


def test_cpu_passes_batches_through_unchanged(shardset):
    ds = wds.WebDataset(shardset[4:5], shardshuffle=False).decode().to_tuple("npy", "cls").batched(8)
    expected = list(ds)
    got = list(DevicePrefetcher(ds, device="cpu"))
    assert len(got) == len(expected)
    for (a1, l1), (a2, l2) in zip(expected, got):
        assert np.array_equal(a1, a2) and np.array_equal(l1, l2)


def test_to_device_keeps_structure_and_converts_arrays():
    Pair = collections.namedtuple("Pair", "x y")
    batch = {"a": np.ones((2, 3), np.float32), "b": [torch.zeros(2), "text"], "c": Pair(torch.ones(1), 5)}
    moved = to_device(batch, "cpu", pin_memory=False, non_blocking=False)
    assert isinstance(moved["a"], torch.Tensor) and moved["a"].shape == (2, 3)
    assert isinstance(moved["b"], list) and moved["b"][1] == "text"
    assert isinstance(moved["c"], Pair) and moved["c"].y == 5


def test_depth_is_validated():
    with pytest.raises(ValueError):
        DevicePrefetcher([], depth=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_prefetch_moves_batches_ahead():
    batches = [(torch.full((64, 3, 32, 32), float(i)), torch.tensor([i])) for i in range(10)]
    got = list(DevicePrefetcher(batches, device="cuda", depth=3))
    assert len(got) == 10
    for i, (x, y) in enumerate(got):
        assert x.is_cuda and y.is_cuda
        assert float(x[0, 0, 0, 0]) == float(i) and int(y[0]) == i
