"""torch is imported only when a feature needs it, and DataLoader accepts our datasets whether
torch was imported before or after shardstream."""

from __future__ import annotations

import subprocess
import sys

import pytest

from needs import needs_torch

CHECK = """
import sys, warnings
warnings.filterwarnings("ignore")
{before}
import shardstream as wds
shards = sys.argv[1:]
n = sum(len(b[1]) for b in wds.WebDataset(shards, shardshuffle=False).decode("rgb8")
        .to_tuple("__key__", "cls", handler=wds.ignore_and_continue).batched(4))
assert n > 0
{middle}
import torch, torch.utils.data as data
ds = wds.WebDataset(shards, shardshuffle=False).to_tuple("__key__")
assert isinstance(ds, data.IterableDataset)
assert sum(1 for _ in data.DataLoader(ds, batch_size=None, num_workers=2)) == sum(1 for _ in ds)
# what torch's IterableDataset gives webdataset's classes: `+` chains, indexing is not implemented
chained = ds + wds.SimpleShardList(shards)
assert isinstance(chained, data.ChainDataset) and len(list(chained)) == sum(1 for _ in ds) + len(shards)
try:
    ds[0]
    raise AssertionError("indexing a dataset worked")
except NotImplementedError:
    pass
print("ok")
"""


@pytest.mark.parametrize("torch_first", [False, True])
@needs_torch
def test_torch_is_lazy_and_dataloader_accepts_datasets(shardset, torch_first):
    before = "import torch" if torch_first else ""
    middle = "" if torch_first else "assert 'torch' not in sys.modules, 'shardstream imported torch'"
    code = CHECK.format(before=before, middle=middle)
    result = subprocess.run([sys.executable, "-c", code, *shardset], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
