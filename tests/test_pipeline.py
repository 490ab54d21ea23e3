"""DataPipeline accepts whatever webdataset accepts as a stage: torch IterableDatasets (subclassed
by user code, as OpenCLIP's ResampledShards2 is), DataLoaders, lists, PipelineStages, callables."""

import os
import subprocess
import sys
import textwrap

import pytest

import shardstream as wds
from needs import needs_torch

SCRIPT = textwrap.dedent(
    """
    import sys
    if sys.argv[1] == "torch-first":
        import torch.utils.data
        import shardstream as wds
    else:
        import shardstream as wds
        import torch.utils.data

    class Numbers(torch.utils.data.IterableDataset):  # like open_clip_train.data.ResampledShards2
        def __iter__(self):
            for i in range(6):
                yield dict(n=i)

    def double(src):
        for item in src:
            yield dict(n=item["n"] * 2)

    for engine in (True, False):
        pipe = wds.DataPipeline(Numbers(), double, wds.map(lambda x: x["n"]))
        pipe = pipe.with_engine(enabled=engine)
        assert list(pipe) == [0, 2, 4, 6, 8, 10], (engine, list(pipe))
        composed = wds.DataPipeline(Numbers()).compose(double).with_engine(enabled=engine)
        assert [x["n"] for x in composed] == [0, 2, 4, 6, 8, 10]
        fluent = wds.FluidWrapper(Numbers()).with_engine(enabled=engine).map(lambda x: (x["n"] + 1,)).batched(3)
        assert [list(b[0]) for b in fluent] == [[1, 2, 3], [4, 5, 6]], list(fluent)
    print("ok")
    """
)


@pytest.mark.parametrize("order", ["torch-first", "shardstream-first"])
@needs_torch
def test_torch_iterable_dataset_subclass_is_a_source(order):
    done = subprocess.run([sys.executable, "-c", SCRIPT, order], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


class Stage(wds.PipelineStage):
    def run(self, src):
        for x in src:
            yield x + 100


@pytest.mark.parametrize("engine", [True, False])
def test_every_kind_of_stage(engine):
    torch_data = pytest.importorskip("torch.utils.data")

    class Source(torch_data.IterableDataset):
        def __iter__(self):
            return iter(range(4))

    loader = torch_data.DataLoader(Source(), batch_size=None, num_workers=0)
    # (a list passed to DataPipeline is a list of stages, as in webdataset; [list] is a source)
    for source in (Source(), loader, [[0, 1, 2, 3]]):
        pipe = wds.DataPipeline(source, Stage(), wds.map(lambda x: x * 2)).with_engine(enabled=engine)
        assert list(pipe) == [200, 202, 204, 206]


def test_not_a_stage_names_it():
    with pytest.raises(ValueError, match="not a valid pipeline stage"):
        list(wds.DataPipeline([1, 2], 42))


def _epoch_shards(tmp_path):
    from shardsets import sample_members, write_tar

    return [write_tar(str(tmp_path / f"e{n}.tar"), [m for i in range(n * 2, n * 2 + 2) for m in sample_members(i, exts=("cls",))])
            for n in range(8)]


@needs_torch
def test_set_epoch_reaches_a_plain_dataloaders_persistent_workers(tmp_path):
    """The README says a set epoch reaches DataLoader workers, persistent ones too; only
    WebLoader shared it, so with torch's own DataLoader(persistent_workers=True) every epoch
    had epoch 0's shard order (calling set_epoch was worse than not calling it)."""
    import torch

    urls = _epoch_shards(tmp_path)

    def orders(persistent):
        dataset = wds.WebDataset(urls, shardshuffle=100, seed=5).to_tuple("__key__")
        loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2, persistent_workers=persistent)
        seen = []
        for epoch in range(3):
            dataset.set_epoch(epoch)
            seen.append([key for key, in loader])
        return seen

    fresh, persistent = orders(False), orders(True)
    assert persistent == fresh
    assert len({tuple(order) for order in persistent}) == 3  # (each epoch its own order)


@needs_torch
def test_a_webloader_with_persistent_workers_copies_and_pickles(tmp_path):
    """Its shared epoch cell (a RawValue) pickled only while a worker was being started:
    copy.deepcopy or pickle of the loader failed ("cannot pickle 'mmap.mmap' object"), where
    webdataset's loader copies. A copy now has a cell of its own, holding the same epoch."""
    import copy
    import pickle

    loader = wds.WebLoader(wds.WebDataset(_epoch_shards(tmp_path), shardshuffle=False).to_tuple("__key__"),
                           batch_size=None, num_workers=2, persistent_workers=True)
    loader.set_epoch(3)
    for duplicate in (copy.deepcopy(loader), pickle.loads(pickle.dumps(loader))):
        assert sorted(key for key, in duplicate) == sorted(key for key, in loader)


_SWITCHES_CHILD = r"""
import sys, torch
import shardstream as wds

wds.allow_pipe(True)
wds.allow_pickle(True)
ds = wds.WebDataset("pipe:cat " + sys.argv[1], shardshuffle=False).decode().to_tuple("pyd")
loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1, multiprocessing_context="spawn")
print([value for value, in loader])
"""


@needs_torch
def test_process_switches_reach_workers_started_by_spawn(tmp_path):
    """`allow_pipe(True)` and `allow_pickle(True)` (and the engine defaults, and webdataset's
    enforce_security) are process-wide: a spawned or forkserver DataLoader worker imports the
    package afresh and refused the pipe: URL its parent allowed. It takes them from the pipeline."""
    import pickle

    from shardsets import write_tar

    path = write_tar(str(tmp_path / "p.tar"), [(f"s{i}.pyd", pickle.dumps({"i": i})) for i in range(3)])
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", _SWITCHES_CHILD, path], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=root))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[{'i': 0}, {'i': 1}, {'i': 2}]"


@needs_torch
def test_switches_set_after_the_dataset_is_built_hold_in_forked_workers(tmp_path, monkeypatch):
    """The first version sent the switches with every copy of a pipeline (each fluid call copies
    it) and applied them in every worker: a forked worker ran with the values of when the dataset
    was built, so `allow_pipe(True)` called afterwards was undone there, and an `enforce_security`
    turned on afterwards was turned off. Only a spawn or forkserver worker's start sends them."""
    import torch

    from shardsets import write_tar
    from shardstream._base import security
    from shardstream._fetch import open as opening

    monkeypatch.setattr(opening, "_pipe_switch", None)
    monkeypatch.setattr(security, "_enforced", False)
    path = write_tar(str(tmp_path / "f.tar"), [(f"s{i}.txt", b"x") for i in range(3)])
    dataset = wds.WebDataset("pipe:cat " + path, shardshuffle=False).to_tuple("__key__").map(tuple)
    wds.allow_pipe(True)

    def keys():
        return [key for key, in torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=1,
                                                            multiprocessing_context="fork")]

    assert keys() == ["s0", "s1", "s2"]
    security.enforce(True)
    with pytest.raises(Exception, match="pipe"):
        keys()
