"""The fused tar -> samples path: shard ranges (restart positions), with and without an index,
mapped and chunked sources, and the TarReader start offset."""

from __future__ import annotations

import gzip
import io
import shutil
import subprocess
import sys
import tarfile
import warnings

import pytest
from shardsets import tar_bytes, write_tar, zero_members

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


# --- a shard cut short: every sample before the member it is cut in comes out ------------------


def _cut_cases(raw: bytes):
    """(cut, the keys of the samples that a reader must hand out) for cuts in and around each
    member header of `raw`: a sample is whole once the header of a member of another sample is
    read (webdataset hands it out too); a cut inside a header leaves the sample before it open."""
    infos = list(tarfile.open(fileobj=io.BytesIO(raw)))
    keys = [info.name.split(".")[0] for info in infos]
    cases = []
    for i, info in enumerate(infos[1:], 1):
        before = list(dict.fromkeys(keys[:i]))  # the samples of the members before this one, in order
        whole = before if keys[i] != keys[i - 1] else before[:-1]
        cases.append((info.offset + 100, before[:-1]))  # inside the header: unknown what follows
        cases.append((info.offset + 512, whole))  # the header read, none of its data
        cases.append((info.offset_data + info.size // 2, whole))  # inside its data
    return cases


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("handler", ["reraise_exception", "warn_and_continue"])
def test_a_cut_shard_hands_out_every_sample_before_the_member_it_is_cut_in(tmp_path, gz, handler):
    members = [(f"s{i:02d}.{ext}", bytes([i]) * (300 + 700 * j)) for i in range(4) for j, ext in enumerate(("a", "b"))]
    raw = open(write_tar(str(tmp_path / "whole.tar"), members), "rb").read()
    path = tmp_path / ("cut.tar.gz" if gz else "cut.tar")
    for cut, expected in _cut_cases(raw):
        path.write_bytes(gzip.compress(raw[:cut], mtime=0) if gz else raw[:cut])
        got = []
        ds = wds.WebDataset(str(path), shardshuffle=False, handler=getattr(wds, handler), empty_check=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                for sample in ds:
                    got.append(sample)
            except wds.FormatError as exn:
                assert handler == "reraise_exception" and exn.url == str(path) and exn.offset is not None
            else:
                assert handler == "warn_and_continue", cut
        assert _keys(got) == expected, cut
        for sample in got:  # and each is whole
            assert sample["a"] == bytes([int(sample["__key__"][1:])]) * 300 and len(sample["b"]) == 1000


def test_a_transfer_that_breaks_inside_a_member_of_the_next_sample_hands_out_the_one_before(tmp_path):
    """A fetch error (retries spent) inside the data of a new sample's first member: the sample
    before it is whole, comes out, and the cursor says the next one starts at that header."""
    from shardstream._shard.members import chunk_member_batches
    from shardstream._shard.samples import ShardCursor, shard_samples

    members = [(f"s{i:02d}.{ext}", bytes([i]) * 3000) for i in range(3) for ext in ("a", "b")]
    raw = open(write_tar(str(tmp_path / "s.tar"), members), "rb").read()
    info = [m for m in tarfile.open(fileobj=io.BytesIO(raw)) if m.name == "s02.a"][0]

    def chunks():
        yield raw[: info.offset_data + 1000]
        raise wds.NetworkError("connection reset", url="http://host/s.tar")

    cursor = ShardCursor()
    cursor.start(0)
    got = []
    with pytest.raises(wds.NetworkError) as caught:
        for sample in shard_samples(chunk_member_batches(chunks(), "http://host/s.tar", info=cursor.info), "http://host/s.tar",
                                    cursor=cursor):
            got.append(sample)
    assert _keys(got) == ["s00", "s01"] and got[1]["b"] == bytes([1]) * 3000
    assert caught.value.member == "s02.a" and caught.value.pending == ("s02.a", info.offset)
    assert cursor.position == (0, 2, info.offset)


@pytest.mark.parametrize("handler", ["reraise_exception", "ignore_and_continue"])
def test_a_header_after_the_end_of_archive_comes_after_every_sample_of_the_archive(tmp_path, handler):
    """Two archives concatenated: the first one's samples are all whole (its end-of-archive block
    says so), so all come out before the error (webdataset stops there quietly, with the same samples)."""
    import webdataset

    parts = []
    for n, first in enumerate((0, 100)):
        members = [(f"s{i:04d}.{ext}", f"{ext}{i}".encode()) for i in range(first, first + 5) for ext in ("txt", "cls")]
        parts.append(open(write_tar(str(tmp_path / f"part{n}.tar"), members), "rb").read())
    path = tmp_path / "two.tar"
    path.write_bytes(b"".join(parts))
    got = []
    try:
        for sample in wds.WebDataset(str(path), shardshuffle=False, handler=getattr(wds, handler), empty_check=False):
            got.append(sample)
    except wds.FormatError as exn:
        assert handler == "reraise_exception" and "after the end-of-archive block" in str(exn)
    else:
        assert handler == "ignore_and_continue"
    theirs = [s["__key__"] for s in webdataset.WebDataset(str(path), shardshuffle=False)]
    assert _keys(got) == theirs == [f"s{i:04d}" for i in range(5)]
    assert got[-1]["cls"] == b"cls4"


@pytest.mark.parametrize("refused", ["negative size", "invalid PAX size"])
@pytest.mark.parametrize("handler", [None, "warn_and_continue"])
def test_a_refused_header_of_a_new_sample_hands_out_the_sample_before_it(tmp_path, refused, handler):
    """A header that passes its checksum and names a new sample but is refused (a negative size,
    a PAX size that is no number) held back the whole sample before it, under every handler;
    one claiming a size past the end hands it out (the sample is whole either way)."""
    from tarvectors import patch_header

    whole = [("s0.jpg", b"J" * 10), ("s0.txt", b"T")]  # headers at 0 and 1024: s1.jpg's at 2048
    if refused == "negative size":
        archive = patch_header(tar_bytes([*whole, ("s1.jpg", b"J"), ("s2.jpg", b"x")]), 2048, 124, b"-0000000001\0")
    else:
        def pax_sized(tar):
            for name, size in (("s1.jpg", "abc"), ("s2.jpg", None)):
                info = tarfile.TarInfo(name)
                info.size = 1
                if size is not None:
                    info.pax_headers = {"size": size}
                tar.addfile(info, io.BytesIO(b"J"))

        archive = tar_bytes(whole, fmt=tarfile.PAX_FORMAT, extra=pax_sized)
    path = tmp_path / "refused.tar"
    path.write_bytes(archive)
    kw = {} if handler is None else {"handler": getattr(wds, handler)}
    got = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            got.extend(s["__key__"] for s in wds.WebDataset(str(path), shardshuffle=False, **kw))
        except wds.FormatError as exn:
            assert handler is None and exn.member == "s1.jpg" and exn.offset == 2048
    assert got == ["s0"]


_PEAK_CHILD = r'''
import sys
import shardstream as wds
peak = lambda: int([l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]) >> 10
before, n = peak(), 0
for sample in wds.WebDataset(sys.argv[1], shardshuffle=False):
    n += len(sample["npy"]) >> 20
    del sample
print(n, peak() - before)
'''


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads VmHWM from /proc")
def test_a_highly_compressible_shard_costs_a_step_of_memory_not_the_shard(tmp_path):
    """A 130 KB .tar.gz of 128 MiB of zeros (masks, padded arrays) took twice the whole
    uncompressed shard (its one chunk inflated at once): ~260 MB added; now a few steps."""
    path = tmp_path / "zeros.tar.gz"
    path.write_bytes(gzip.compress(tar_bytes(zero_members(128))))
    done = subprocess.run([sys.executable, "-c", _PEAK_CHILD, str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    mib, added = map(int, done.stdout.split())
    assert mib == 128 and added < 100, added
