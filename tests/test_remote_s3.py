"""S3 shards end to end through WebDataset, against a real moto_server subprocess."""

from __future__ import annotations

import warnings

import pytest
from motoserver import moto_endpoint, s3_admin, s3_env  # noqa: F401  (fixtures)
from shardsets import fails_at_header, liar_shard

import shardstream as wds

warnings.filterwarnings("ignore", message=".*shardshuffle.*")


@pytest.fixture()
def s3_shards(s3_env, s3_admin, shardset):
    bucket = "shards-e2e"
    try:
        s3_admin.create_bucket(Bucket=bucket)
    except s3_admin.exceptions.BucketAlreadyOwnedByYou:
        pass
    urls = []
    for path in shardset:
        key = "train/" + path.rsplit("/", 1)[1]
        with open(path, "rb") as f:
            s3_admin.put_object(Bucket=bucket, Key=key, Body=f.read())
        urls.append(f"s3://{bucket}/{key}")
    return urls


def _keys(samples):
    return [(s["__key__"], sorted(k for k in s if not k.startswith("__"))) for s in samples]


@pytest.mark.timeout(90)
def test_s3_gives_the_same_samples_as_local_files(s3_shards, shardset):
    local = list(wds.WebDataset(shardset, shardshuffle=False))
    remote = list(wds.WebDataset(s3_shards, shardshuffle=False))
    assert _keys(remote) == _keys(local)
    assert [s.get("npy") for s in remote] == [s.get("npy") for s in local]


@pytest.mark.timeout(90)
def test_s3_prefix_and_glob_specs_are_listed(s3_shards):
    prefix = s3_shards[0].rsplit("/", 1)[0] + "/"
    assert wds.SimpleShardList(prefix).urls == sorted(s3_shards)
    glob = prefix + "shard-00[0-2].tar"
    assert wds.SimpleShardList(glob).urls == sorted(s3_shards)[:3]


@pytest.mark.timeout(90)
def test_an_s3_key_that_holds_glob_characters_is_read_as_named(s3_shards, s3_admin, shardset):
    """`?`, `[` and `*` are legal in a key: `s3://b/train/q?x.tar` read its own samples and those
    of `qAx.tar` (a glob); `br[1].tar` was "no shards match". A local file is read as named."""
    bucket = s3_shards[0].split("/")[2]
    with open(shardset[0], "rb") as f:
        first = f.read()
    with open(shardset[1], "rb") as f:
        second = f.read()
    for key, body in [("odd/q?x.tar", first), ("odd/qAx.tar", second), ("odd/br[1].tar", first),
                      ("odd/br1.tar", second)]:
        s3_admin.put_object(Bucket=bucket, Key=key, Body=body)
    for name in ("q?x.tar", "br[1].tar"):
        url = f"s3://{bucket}/odd/{name}"
        assert wds.SimpleShardList(url).urls == [url]
        assert _keys(wds.WebDataset(url, shardshuffle=False)) == _keys(wds.WebDataset(shardset[:1], shardshuffle=False))
    assert wds.SimpleShardList(f"s3://{bucket}/odd/q*.tar").urls == [f"s3://{bucket}/odd/q{c}x.tar" for c in "?A"]


@pytest.mark.timeout(90)
def test_an_s3_prefix_lists_its_shards_not_the_files_beside_them(s3_shards, s3_admin, shardset, tmp_path):
    """`shardstream create SRC s3://bucket/train/` writes sizes.json, classes.json and .idx files
    beside the shards: a prefix reads as its shards, as a local folder does (a glob names its
    objects itself)."""
    bucket, _, key = s3_shards[0][5:].partition("/")
    prefix = key.rsplit("/", 1)[0] + "/"
    for extra in ("sizes.json", "classes.json", key.rsplit("/", 1)[1] + ".idx", ".hidden.tar", "sub/"):
        s3_admin.put_object(Bucket=bucket, Key=prefix + extra, Body=b"{}")
    assert wds.SimpleShardList(f"s3://{bucket}/{prefix}").urls == sorted(s3_shards)
    assert _keys(wds.WebDataset(f"s3://{bucket}/{prefix}", shardshuffle=False)) == _keys(
        wds.WebDataset(shardset, shardshuffle=False))
    assert wds.SimpleShardList(f"s3://{bucket}/{prefix}*.json").urls == [
        f"s3://{bucket}/{prefix}classes.json", f"s3://{bucket}/{prefix}sizes.json"]
    from shardstream.cli import main

    out = tmp_path / "resharded"  # `create` reads such a prefix as its source shards too
    assert main(["create", f"s3://{bucket}/{prefix}", str(out), "--maxcount", "1000", "--rekey", "-q"]) == 0
    fields = lambda samples: sorted(fields for _, fields in _keys(samples))  # noqa: E731  (rekeyed)
    assert fields(wds.WebDataset(str(out) + "/", shardshuffle=False)) == fields(wds.WebDataset(shardset, shardshuffle=False))


@pytest.mark.timeout(90)
def test_missing_s3_key_is_not_found(s3_shards):
    with pytest.raises(wds.ShardNotFound):
        list(wds.WebDataset([s3_shards[0].replace("shard-000", "nothere")], shardshuffle=False))


@pytest.mark.timeout(90)
def test_s3_with_disk_cache(s3_shards, tmp_path):
    ds = wds.WebDataset(s3_shards, shardshuffle=False, cache_dir=str(tmp_path))
    it = iter(ds)
    first = _keys(it)
    assert it.stats().cache["disk"]["misses"] == len(s3_shards)
    it = iter(ds)
    assert _keys(it) == first
    assert it.stats().cache["disk"]["hits"] == len(s3_shards)


@pytest.mark.timeout(90)
def test_s3_resume_seeks_with_a_range_request(s3_shards, shardset):
    """A checkpoint mid-shard resumes at the next sample's byte offset over S3 (a ranged GET),
    without opening the shards before it; the samples are those of one uninterrupted pass."""
    def build():
        return wds.WebDataset(s3_shards, shardshuffle=False).to_tuple("__key__")

    full = list(build())
    first_ds = build()
    it = iter(first_ds)
    first = [next(it) for _ in range(len(full) - 5)]
    state = first_ds.state_dict()
    it.close()
    position = state["position"]
    assert position is not None and len(position) == 4
    resumed = build()
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert first + rest == full
    stats = resumed.stats().source
    assert stats["shards"] <= 2  # the shard it stopped in (and at most the next): none before
    assert position[3] is not None and stats["bytes"] < position[3]  # entered at the offset, not read up to it


@pytest.mark.timeout(90)
def test_a_huge_claimed_size_over_s3_fails_at_its_header(s3_env, s3_admin):
    """A member header claiming more bytes than the object holds is refused at that header (the S3
    fetcher notes the object's size on its stream, as the HTTP one does), not after buffering the
    rest of the object as the member's data."""
    bucket = "shards-liar"
    try:
        s3_admin.create_bucket(Bucket=bucket)
    except s3_admin.exceptions.BucketAlreadyOwnedByYou:
        pass
    s3_admin.put_object(Bucket=bucket, Key="liar.tar", Body=liar_shard(32))  # 32 MiB follow, not 8 GiB
    url = f"s3://{bucket}/liar.tar"
    # The client (botocore's service models: megabytes) is made before memory is measured.
    s3_admin.put_object(Bucket=bucket, Key="empty.tar", Body=b"\0" * 1024)
    assert list(wds.WebDataset(f"s3://{bucket}/empty.tar", shardshuffle=False, empty_check=False)) == []
    error, peak = fails_at_header(lambda: list(wds.WebDataset(url, shardshuffle=False)),
                                  match=r"needs 8589935104 bytes from its header, the shard has 33554944 left")
    assert (error.url, error.member, error.offset) == (url, "s0.bin", 0)
    assert url in str(error) and "s0.bin" in str(error) and "offset=0" in str(error)
    assert peak < 12 << 20, peak
