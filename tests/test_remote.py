"""Remote shards end to end: WebDataset over a real local HTTP server, with and without the
shard cache; the same samples as from local files."""

from __future__ import annotations

import os
import sys
import warnings

import pytest

import shardstream as wds

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "tools"))
from shardserver import ShardServer  # noqa: E402

warnings.filterwarnings("ignore", message=".*shardshuffle.*")


def _keys(samples):
    return [(s["__key__"], sorted(k for k in s if not k.startswith("__"))) for s in samples]


@pytest.fixture()
def served(shardset):
    root = os.path.dirname(shardset[0])
    with ShardServer(root, latency_ms=5) as server:
        yield server, [server.url(os.path.basename(p)) for p in shardset]


@pytest.mark.timeout(60)
def test_http_gives_the_same_samples_as_local_files(served, shardset):
    _server, urls = served
    local = list(wds.WebDataset(shardset, shardshuffle=False))
    remote = list(wds.WebDataset(urls, shardshuffle=False))
    assert _keys(remote) == _keys(local)
    assert [s.get("jpg") for s in remote] == [s.get("jpg") for s in local]
    assert all(s["__url__"].startswith("http://") and "__local_path__" not in s for s in remote)


@pytest.mark.timeout(60)
def test_disk_cache_streams_through_then_serves_hits(served, shardset, tmp_path):
    server, urls = served
    ds = wds.WebDataset(urls, shardshuffle=False, cache_dir=str(tmp_path))
    it = iter(ds)
    first = list(it)
    stats = it.stats()
    assert stats.cache["disk"]["misses"] == len(urls)
    files = [f for f in os.listdir(tmp_path) if f.endswith(".tar") or f.endswith(".tar.gz")]
    assert len(files) == len(urls)
    requests = server.stats.snapshot().requests
    it = iter(ds)
    second = list(it)
    assert _keys(second) == _keys(first)
    assert it.stats().cache["disk"]["hits"] == len(urls)
    assert server.stats.snapshot().requests == requests  # nothing fetched again
    assert "cache disk:" in it.stats().format()
