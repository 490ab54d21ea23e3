"""Local listings (`_fetch/listing.py`): globs and folders name their shards, sorted, through
every shard source; what a folder's listing keeps; a folder that is not there says so."""

from __future__ import annotations

import itertools
import os

import pytest
from shardsets import write_tar

import shardstream as wds


@pytest.fixture
def folder(tmp_path):
    for i in (2, 0, 1):
        write_tar(str(tmp_path / f"train-{i:03d}.tar"), [(f"s{i}{j}.txt", b"x") for j in range(3)])
    write_tar(str(tmp_path / "extra.tar.gz"), [("z.txt", b"z")], gz=True)
    (tmp_path / "sizes.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("not a shard")
    os.mkdir(tmp_path / "nested.tar")  # a folder named like a shard is not one
    return str(tmp_path)


def test_a_folder_names_the_shards_in_it_sorted(folder):
    expected = [f"{folder}/{name}" for name in ("extra.tar.gz", "train-000.tar", "train-001.tar", "train-002.tar")]
    assert wds.SimpleShardList(folder + "/").urls == expected
    keys = [s["__key__"] for s in wds.WebDataset(folder + "/", shardshuffle=False)]
    assert keys == ["z"] + [f"s{i}{j}" for i in range(3) for j in range(3)]


def test_a_glob_names_the_files_it_matches_sorted(folder):
    assert wds.SimpleShardList(folder + "/train-*.tar").urls == [f"{folder}/train-{i:03d}.tar" for i in range(3)]
    assert len(list(wds.WebDataset(folder + "/train-00[01].tar", shardshuffle=False))) == 6


@pytest.mark.parametrize("name, other", [("train[1].tar", "train1.tar"), ("a*b.tar", "aXXb.tar"), ("only[2].tar", None)])
def test_a_file_whose_name_holds_glob_characters_is_read_as_named(tmp_path, name, other):
    """webdataset opens `train[1].tar` as named; it was expanded as a glob, which read
    `train1.tar` instead (no error), both `a*b.tar` and `aXXb.tar`, or nothing at all."""
    write_tar(str(tmp_path / name), [("named.txt", b"x")])
    if other:
        write_tar(str(tmp_path / other), [("other.txt", b"x")])
    path = str(tmp_path / name)
    for spec in (path, [path], "file://" + path):
        assert [s["__key__"] for s in wds.WebDataset(spec, shardshuffle=False)] == ["named"]
    assert wds.SimpleShardList(path).urls == [path]
    assert len(wds.SimpleShardList(str(tmp_path / "*.tar")).urls) == (2 if other else 1)  # (a glob is still one)


def test_a_missing_folder_is_shard_not_found_naming_it(tmp_path):
    with pytest.raises(wds.ShardNotFound, match="cannot list the folder") as info:
        wds.WebDataset(str(tmp_path / "gone") + "/", shardshuffle=False)
    assert info.value.url == str(tmp_path / "gone") + "/"


def test_a_glob_or_folder_that_names_no_shard_is_an_error_in_the_loader_and_the_cli(folder, tmp_path_factory, capsys):
    """A typo in a spec must not read as no data, nor a `::` source of a mix vanish from it."""
    from shardstream.cli import main

    empty = str(tmp_path_factory.mktemp("empty"))
    for spec, named in [(folder + "/nomatch-*.tar", folder + "/nomatch-*.tar"), (empty + "/", empty + "/"),
                        (f"{folder}/train-000.tar::{folder}/nomatch-*.tar", folder + "/nomatch-*.tar")]:
        with pytest.raises(wds.ShardNotFound, match="no shards match") as info:
            wds.WebDataset(spec, shardshuffle=False)
        assert info.value.url == named
        for command in ("verify", "ls"):
            assert main([command, spec]) == 1, (command, spec)
            assert named in capsys.readouterr().err
    assert main(["verify", empty]) == 1 and "no shards in this folder" in capsys.readouterr().err


def test_a_folder_given_as_a_shard_says_it_is_a_folder(folder):
    with pytest.raises(wds.FetchError, match="it is a directory .*with a trailing '/'") as info:
        list(wds.WebDataset(folder, shardshuffle=False))
    assert info.value.url == folder


def test_resampled_shards_draw_from_listed_folders_and_globs_by_source(folder, tmp_path_factory):
    """`::` sources that are folders or globs are listed before the draws: the weights are per
    source whatever its shard count, and a source that names nothing is an error, not a share lost."""
    other = tmp_path_factory.mktemp("other")
    write_tar(str(other / "b-0.tar"), [("b.txt", b"b")])
    spec = f"{folder}/train-*.tar::{other}/"
    shards = wds.ResampledShards(spec, seed=0, deterministic=True, weights=[1, 3], mix="exact")
    assert shards.urls == [f"{folder}/train-{i:03d}.tar" for i in range(3)] + [f"{other}/b-0.tar"]
    drawn = [d["url"] for d in itertools.islice(iter(shards), 400)]
    assert drawn.count(f"{other}/b-0.tar") == 300
    with pytest.raises(wds.ShardNotFound, match="no shards match") as info:
        wds.ResampledShards(f"{folder}/train-*.tar::{folder}/none-*.tar", weights=[1, 1])
    assert info.value.url == f"{folder}/none-*.tar"
    keys = {s["__key__"] for s in itertools.islice(iter(wds.WebDataset(f"{other}/", resampled=True, seed=1)), 5)}
    assert keys == {"b"}


def test_file_urls_list_as_their_paths_do(folder):
    assert wds.SimpleShardList(f"file://{folder}/").urls == wds.SimpleShardList(folder + "/").urls
    assert wds.SimpleShardList(f"file://{folder}/train-*.tar").urls == wds.SimpleShardList(folder + "/train-*.tar").urls


def test_exact_resampled_draws_count_their_shards_once_not_every_pass(folder, monkeypatch):
    """mix="exact" looked up every shard's count again on every pass (5 s of CPU per pass for a
    million shards, and sizes.json asked for again from a remote origin)."""
    import shardstream.shardlists as shardlists

    looked_up = []
    counts = shardlists.known_counts
    monkeypatch.setattr(shardlists, "known_counts", lambda urls: looked_up.append(len(urls)) or counts(urls))
    shards = wds.ResampledShards(f"{folder}/train-*.tar", seed=0, deterministic=True, weights=[1], mix="exact",
                                 nshards=5)
    passes = []
    for epoch in range(3):
        shards.set_epoch(epoch)
        passes.append([d["url"] for d in shards])
    assert looked_up == [3] and all(len(urls) == 5 for urls in passes)
