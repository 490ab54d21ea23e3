"""The fused tar -> samples path: shard ranges (restart positions), with and without an index,
mapped and chunked sources, and the TarReader start offset."""

from __future__ import annotations

import gzip
import shutil

import pytest

import shardstream as wds
from shardstream._shard.index import scan_shard, write_index
from shardstream._fetch.open import iter_chunks


def _keys(items):
    return [s["__key__"] for s in items]


@pytest.fixture()
def shard(shardset, tmp_path):
    path = str(tmp_path / "s.tar")
    shutil.copy(shardset[4], path)  # 37 samples
    return path


def _run(items, stage=None):
    return list(wds.DataPipeline(lambda: iter(items), stage or wds.TarShardSamples()))


def _range(path, start, stop):
    return _run([dict(url=path, start=start, stop=stop)])


@pytest.mark.parametrize("indexed", [False, True])
@pytest.mark.parametrize("start, stop", [(0, None), (0, 5), (5, 6), (10, 37), (36, None), (20, 20), (37, None)])
def test_shard_ranges_equal_slices_of_the_whole_shard(shard, indexed, start, stop):
    whole = _run([shard])
    if indexed:
        write_index(shard + ".idx", scan_shard(shard, iter_chunks(shard)))
    got = _range(shard, start, stop)
    assert _keys(got) == _keys(whole[start:stop])
    assert [s["npy"] for s in got] == [s["npy"] for s in whole[start:stop]]


def test_an_index_avoids_reading_the_start(shard):
    write_index(shard + ".idx", scan_shard(shard, iter_chunks(shard)))
    stage = wds.TarShardSamples()
    _run([dict(url=shard, start=30)], stage)
    import os

    assert stage.source_stats.bytes < os.path.getsize(shard) / 3


def test_ranges_of_a_gzip_shard_are_read_by_skipping(shard, tmp_path):
    gz = str(tmp_path / "s.tar.gz")
    with open(shard, "rb") as f, open(gz, "wb") as g:
        g.write(gzip.compress(f.read()))
    whole = _run([shard])
    assert _keys(_range(gz, 7, 12)) == _keys(whole[7:12])


def test_chunked_and_mapped_sources_agree(shardset):
    mapped = _run(shardset)
    chunked = _run(shardset, wds.TarShardSamples(opener=lambda url: iter_chunks(url, chunk_size=777)))
    assert _keys(mapped) == _keys(chunked)
    assert all(a.keys() == b.keys() for a, b in zip(mapped, chunked))


def test_reader_start_offset_reports_archive_offsets(shard):
    import tarfile

    members = [m for m in tarfile.open(shard) if m.isreg()]
    start = members[8].offset
    reader = wds.TarReader(shard, start_offset=start)
    data = open(shard, "rb").read()[start:]
    got = reader.feed(data) + reader.close()
    assert [(m.name, m.offset) for m in got] == [(m.name, m.offset) for m in members[8:]]
