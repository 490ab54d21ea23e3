"""The device prefetcher: pass-through on CPU, structure-preserving moves, CUDA when present."""

from __future__ import annotations

import collections
import dataclasses
import gc
import threading
import time
import traceback
import warnings

import numpy as np
import pytest

import shardstream as wds
from shardstream.prefetch import DevicePrefetcher, to_device
torch = pytest.importorskip("torch", reason="the prefetcher moves torch tensors")

warnings.filterwarnings("ignore", message=".*shardshuffle.*")


def test_cpu_passes_batches_through_unchanged(shardset):
    ds = wds.WebDataset(shardset[4:5], shardshuffle=False).decode().to_tuple("npy", "cls").batched(8)
    expected = list(ds)
    got = list(DevicePrefetcher(ds, device="cpu"))
    assert len(got) == len(expected)
    for (a1, l1), (a2, l2) in zip(expected, got):
        assert np.array_equal(a1, a2) and np.array_equal(l1, l2)


def test_to_device_keeps_structure_and_converts_arrays():
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


Pair = collections.namedtuple("Pair", "x y")


@dataclasses.dataclass
class Batch:
    images: torch.Tensor
    labels: np.ndarray
    names: list


def _batches(n=8):
    return [
        {"pair": Pair(torch.full((2, 3), float(i)), np.arange(3) + i), "batch": Batch(torch.ones(4) * i, np.array([i]), [f"n{i}"]), "i": i}
        for i in range(n)
    ]


def _prefetch_threads():
    return [t for t in threading.enumerate() if t.name == "shardstream-prefetch"]


@pytest.mark.timeout(30)
def test_cpu_path_keeps_order_and_objects():
    batches = _batches()
    got = list(DevicePrefetcher(batches, device="cpu", depth=3))
    assert len(got) == len(batches) and all(a is b for a, b in zip(batches, got))  # passed through untouched


@pytest.mark.timeout(30)
def test_cpu_path_prefetches_depth_ahead_in_a_background_thread():
    pulled = []

    def source():
        for i in range(20):
            pulled.append((i, threading.current_thread().name))
            yield i

    it = iter(DevicePrefetcher(source(), device="cpu", depth=3))
    assert next(it) == 0
    deadline = time.monotonic() + 5
    while len(pulled) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    assert len(pulled) == 4  # the one handed out and `depth` ahead: credits bound the thread
    assert {name for _, name in pulled} == {"shardstream-prefetch"}
    assert list(it) == list(range(1, 20))


@pytest.mark.timeout(30)
def test_loader_error_is_raised_in_the_consumer():
    def source():
        yield 1
        yield 2
        raise KeyError("broken batch")

    it = iter(DevicePrefetcher(source(), device="cpu"))
    assert [next(it), next(it)] == [1, 2]
    with pytest.raises(KeyError, match="broken batch") as info:
        next(it)
    assert "source" in "".join(traceback.format_tb(info.value.__traceback__))  # the loader's own frame


@pytest.mark.timeout(30)
def test_a_loader_error_leaves_no_batch_in_a_reference_cycle():
    """A batch held only by a garbage cycle is freed wherever the collector next runs. On CUDA that
    can be a DataLoader worker forked meanwhile, where freeing a CUDA or pinned tensor aborts the
    worker ("CUDA error: initialization error"; seen on an H100 when a pinned WebLoader followed
    a prefetcher that had raised)."""
    def source():
        for i in range(100):
            if i == 10:
                raise KeyError("broken batch")
            yield torch.full((4, 4), float(i))

    gc.collect()
    gc.disable()
    try:
        with pytest.raises(KeyError):
            for _ in DevicePrefetcher(source(), device="cpu", depth=4):
                pass
        del _
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        in_cycles = [type(o).__name__ for o in gc.garbage if isinstance(o, torch.Tensor)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert in_cycles == []


@pytest.mark.timeout(30)
def test_leaving_the_loop_stops_the_thread_and_closes_the_loader():
    closed = threading.Event()

    def endless():
        try:
            i = 0
            while True:
                yield i
                i += 1
        finally:
            closed.set()

    for i, _ in enumerate(DevicePrefetcher(endless(), device="cpu", depth=2)):
        if i == 3:
            break
    assert closed.wait(5)
    deadline = time.monotonic() + 5
    while _prefetch_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _prefetch_threads() == []


@pytest.mark.timeout(60)
def test_on_top_of_a_subprocess_loader(shardset):
    ds = wds.WebDataset(shardset[4:5], shardshuffle=False).decode().to_tuple("npy", "__key__").batched(4)
    expected = list(ds)
    got = list(DevicePrefetcher(wds.SubprocessLoader(ds), device="cpu", depth=2))
    assert len(got) == len(expected)
    for (a1, k1), (a2, k2) in zip(expected, got):
        assert np.array_equal(a1, a2) and k1 == k2


def test_to_device_keeps_dataclasses():
    moved = to_device(_batches(1)[0], "cpu", pin_memory=False, non_blocking=False)
    assert isinstance(moved["batch"], Batch) and isinstance(moved["batch"].labels, torch.Tensor)
    assert moved["batch"].names == ["n0"] and isinstance(moved["pair"], Pair)


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none on this machine)")


@needs_cuda
@pytest.mark.timeout(60)
def test_cuda_keeps_structure_order_and_values_under_allocator_reuse():
    """Big batches, a consumer that writes to each batch on its stream and frees it: a copy
    landing in memory still in use (no event wait, no record_stream) would corrupt values."""
    batches = [{"x": torch.full((1024, 1024), float(i)), "meta": Batch(torch.tensor([i]), np.array([i]), [i])} for i in range(24)]
    for i, batch in enumerate(DevicePrefetcher(batches, device="cuda", depth=3)):
        x = batch["x"]
        assert x.is_cuda and isinstance(batch["meta"], Batch) and batch["meta"].images.is_cuda
        for _ in range(20):  # keep the consumer's stream busy while the next copies are issued
            x = x * 1.0
        assert float(x[-1, -1]) == float(i) and int(batch["meta"].labels[0]) == i
        batch["x"].add_(1000)


@needs_cuda
@pytest.mark.timeout(60)
def test_cuda_on_top_of_a_subprocess_loader(shardset):
    ds = wds.WebDataset(shardset[4:5], shardshuffle=False).decode().to_tuple("npy", "__key__").batched(4)
    expected = list(ds)
    got = list(DevicePrefetcher(wds.SubprocessLoader(ds), device="cuda", depth=2))
    for (a1, k1), (a2, k2) in zip(expected, got):
        assert a2.is_cuda and np.array_equal(a1, a2.cpu().numpy()) and k1 == k2


@needs_cuda
@pytest.mark.timeout(60)
def test_cuda_consumer_on_its_own_stream_waits_for_the_copies():
    """A training step that runs under `torch.cuda.stream(s)` (as AMP and DDP set-ups do): the
    hand-over waits on the consumer's current stream, not the default one."""
    batches = [torch.full((2048, 1024), float(i)) for i in range(16)]
    step_stream = torch.cuda.Stream()
    with torch.cuda.stream(step_stream):
        for i, x in enumerate(DevicePrefetcher(batches, device=torch.device("cuda", 0), depth=3)):
            for _ in range(10):
                x = x * 1.0
            assert float(x.min()) == float(x.max()) == float(i)


@needs_cuda
@pytest.mark.timeout(120)
def test_cuda_over_a_pinned_webloader_with_an_exact_resume(shardset):
    """WebLoader(pin_memory=True) hands over pinned batches; the prefetcher moves them as they are,
    and its state after k batches resumes a fresh loader at batch k, as on the CPU."""
    def loader():
        ds = wds.WebDataset(shardset[3:5], shardshuffle=False).decode().to_tuple("npy", "__key__").batched(4)
        return wds.WebLoader(ds, batch_size=None, num_workers=2, pin_memory=True)

    expected = [keys for _, keys in loader()]
    batches = DevicePrefetcher(loader(), device="cuda:0", depth=3)
    seen = []
    for images, keys in batches:
        assert images.is_cuda and images.device.index == 0
        seen.append(keys)
        if len(seen) == 5:
            state = batches.state_dict()
            break
    resumed = loader()
    resumed.load_state_dict(state)
    rest = [keys for _, keys in DevicePrefetcher(resumed, device="cuda")]
    assert seen + rest == expected


@needs_cuda
@pytest.mark.timeout(60)
def test_cuda_leaving_the_loop_stops_the_thread_and_errors_reach_the_consumer():
    def source():
        for i in range(1000):
            if i == 50:
                raise KeyError("broken batch")
            yield torch.full((256, 256), float(i))

    for i, _ in enumerate(DevicePrefetcher(source(), device="cuda", depth=4)):
        if i == 3:
            break
    deadline = time.monotonic() + 5
    while _prefetch_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _prefetch_threads() == []
    with pytest.raises(KeyError, match="broken batch"):
        for x in DevicePrefetcher(source(), device="cuda", depth=4):
            assert x.is_cuda
