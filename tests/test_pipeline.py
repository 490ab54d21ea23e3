"""DataPipeline accepts whatever webdataset accepts as a stage: torch IterableDatasets (subclassed
by user code, as OpenCLIP's ResampledShards2 is), DataLoaders, lists, PipelineStages, callables."""

import subprocess
import sys
import textwrap

import pytest

import shardstream as wds

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
