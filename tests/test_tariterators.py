"""The 0.2.x generators (`url_opener`, `tar_file_expander`, `group_by_keys`) that OpenCLIP chains by
hand: a shard-list item's sample range (what the equal-work `split_by_node` yields) is honoured
exactly as on the fused path, so hand-built pipelines get each rank's and worker's own share."""

from __future__ import annotations

import json
import os

import pytest
from shardsets import sample_members, write_tar

import shardstream as wds
from shardstream.tariterators import group_by_keys, tar_file_expander, url_opener

SIZES = [5, 14, 9, 12]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("ranges")
    urls, index = [], 0
    for n, size in enumerate(SIZES):
        members = [m for i in range(index, index + size) for m in sample_members(i, exts=("cls", "txt", "json"))]
        if n == 1:  # a meta member at the start: not a sample, and no sample index
            members.insert(0, ("__index__", b"meta"))
        urls.append(write_tar(str(root / f"part-{n}.tar"), members))
        index += size
    (root / "sizes.json").write_text(json.dumps({os.path.basename(u): s for u, s in zip(urls, SIZES)}))
    return urls


def _by_hand(items):
    """OpenCLIP's tarfile_to_samples_nothrow: the three generators chained."""
    return [s["__key__"] for s in group_by_keys(tar_file_expander(url_opener(items)))]


def _fused(items):
    return [s["__key__"] for s in wds.tarfile_samples(items)]


@pytest.mark.parametrize("start, stop", [(0, None), (0, 4), (3, 7), (5, 14), (13, None), (14, None), (6, 6)])
def test_a_shard_range_gives_the_samples_of_the_fused_path(shards, start, stop):
    keys = _by_hand([dict(url=shards[1], start=start, stop=stop)])
    assert keys == _fused([dict(url=shards[1], start=start, stop=stop)])
    assert keys == [f"s{i:04d}" for i in range(5, 19)][start:stop]


def test_split_by_node_and_worker_then_the_generators_share_out_every_sample_once(shards, monkeypatch):
    parts = {}
    for rank in range(2):
        for worker in range(2):
            for name, value in dict(RANK=rank, WORLD_SIZE=2, WORKER=worker, NUM_WORKERS=2).items():
                monkeypatch.setenv(name, str(value))
            by_hand = wds.DataPipeline(wds.SimpleShardList(shards), wds.split_by_node, wds.split_by_worker, _by_hand)
            fused = wds.DataPipeline(
                wds.SimpleShardList(shards), wds.split_by_node, wds.split_by_worker, wds.tarfile_to_samples()
            )
            parts[rank, worker] = list(by_hand)
            assert parts[rank, worker] == [s["__key__"] for s in fused]
    keys = [k for part in parts.values() for k in part]
    assert len(keys) == len(set(keys)) == sum(SIZES)  # 40 samples: 10 per worker, none dropped
    assert {len(part) for part in parts.values()} == {sum(SIZES) // 4}
