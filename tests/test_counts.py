"""Cheap sample counts (`_counts`): where each comes from, and that a local walk reads headers only."""

import json
import os
import resource
import tarfile

import shardstream._shard.counts as counts
from shardstream._shard.index import scan_shard, walk_shard, write_index
from shardstream._fetch.open import iter_chunks

from shardsets import make_shardset, sample_members, write_tar


def _faults() -> int:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_minflt + usage.ru_majflt


def _sparse_shard(path: str, members: int, payload: int) -> None:
    """A tar whose payloads are holes: `members` x `payload` bytes that cost no disk."""
    with open(path, "wb") as f:
        for i in range(members):
            info = tarfile.TarInfo(f"s{i // 2:04d}.{'jpg' if i % 2 else 'cls'}")
            info.size = payload
            f.write(info.tobuf(tarfile.USTAR_FORMAT))
            f.seek((payload + 511) & -512, os.SEEK_CUR)
        f.write(bytes(1024))


def test_walking_a_local_shard_reads_its_headers_only(tmp_path):
    path = str(tmp_path / "sparse.tar")
    _sparse_shard(path, members=16, payload=256 << 20)  # 4 GiB of payload: ~1M pages if read
    before = _faults()
    summary = walk_shard(path, path)
    assert _faults() - before < 5_000
    assert summary.count == 8
    assert summary.samples[1] == (2 * (512 + (256 << 20)), "s0001")


def test_walk_agrees_with_a_full_scan(tmp_path):
    for shard in make_shardset(str(tmp_path)):
        if shard.endswith(".gz"):
            continue
        walked, scanned = walk_shard(shard, shard), scan_shard(shard, iter_chunks(shard))
        assert (walked.samples, walked.fields, walked.members) == (scanned.samples, scanned.fields, scanned.members)


def test_where_cheap_counts_come_from(tmp_path, monkeypatch):
    monkeypatch.setattr(counts, "_sizes_files", {})
    monkeypatch.setattr(counts, "_walked", {})
    plain = [write_tar(str(tmp_path / f"p{n}.tar"), sample_members(n, exts=("cls",))) for n in range(2)]
    (tmp_path / "sub").mkdir()
    indexed = write_tar(str(tmp_path / "sub" / "i.tar"), [m for i in range(3) for m in sample_members(i, exts=("cls",))])
    write_index(indexed + ".idx", scan_shard(indexed, iter_chunks(indexed)))
    with open(indexed, "r+b") as f:  # the .idx, not the (now unreadable) file, gives the count
        f.write(b"garbage")
    zipped = write_tar(str(tmp_path / "z.tar.gz"), sample_members(0, exts=("cls",)), gz=True)
    missing = str(tmp_path / "missing.tar")
    remote = "http://127.0.0.1:9/x.tar"  # nothing listens on port 9: never asked
    urls = [*plain, indexed, zipped, missing]
    assert counts.cheap_counts(urls) == [1, 1, 3, None, None]
    assert counts.cheap_counts(urls + [remote], {"z.tar.gz": 5, remote: 7, "missing.tar": 2}) == [1, 1, 3, 5, 2, 7]
    with open(tmp_path / "sizes.json", "w") as f:
        json.dump({"p0.tar": 40}, f)
    monkeypatch.setattr(counts, "_sizes_files", {})
    assert counts.cheap_counts(plain) == [40, 1]  # sizes.json before walking
    assert counts.known_counts(plain) == [40, None]  # no walks there


def test_sizes_json_names_a_percent_encoded_http_shard_by_its_file_name(tmp_path, monkeypatch):
    """`a b.tar` served as `.../a%20b.tar`: sizes.json (written on disk, or by `shardstream
    index` over HTTP) keys the file name; the URL's encoded name found no count."""
    from shardserver import ShardServer

    monkeypatch.setattr(counts, "_sizes_files", {})
    write_tar(str(tmp_path / "a b.tar"), [m for i in range(3) for m in sample_members(i, exts=("cls",))])
    with open(tmp_path / "sizes.json", "w") as f:
        json.dump({"a b.tar": 3}, f)
    with ShardServer(str(tmp_path)) as server:
        url = server.url("a b.tar")
        assert "a%20b.tar" in url
        assert counts.known_counts([url]) == [3]
