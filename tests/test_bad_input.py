"""Corrupt, truncated, missing and non-tar shards: a clear error under the default handler,
skipped with a warning under warn_and_continue; nothing hangs, nothing half-delivered."""

from __future__ import annotations

import importlib.util
import warnings

import pytest
from shardsets import corrupt_header, sample_members, write_tar

import shardstream as wds
from needs import needs_torch

warnings.filterwarnings("ignore", message=".*shardshuffle.*")


@pytest.fixture()
def shards(tmp_path):
    good1 = write_tar(str(tmp_path / "good1.tar"), [m for i in range(5) for m in sample_members(i)])
    good2 = write_tar(str(tmp_path / "good2.tar"), [m for i in range(10, 15) for m in sample_members(i)])
    raw = open(good1, "rb").read()
    truncated = tmp_path / "truncated.tar"
    truncated.write_bytes(raw[: len(raw) // 2 + 100])
    corrupt = str(tmp_path / "corrupt.tar")
    offset6 = corrupt_header(good1, corrupt, 6)  # the second sample's third member (4 members a sample)
    notar = tmp_path / "notar.tar"
    notar.write_bytes(b"<html>not a tar file</html>" * 40)
    empty = tmp_path / "empty.tar"
    empty.write_bytes(b"")
    return {
        "good1": good1,
        "good2": good2,
        "truncated": str(truncated),
        "corrupt": corrupt,
        "notar": str(notar),
        "empty": str(empty),
        "missing": str(tmp_path / "missing.tar"),
        "offset6": offset6,
    }


@pytest.mark.parametrize("bad", ["truncated", "corrupt", "notar", "empty", "missing"])
def test_default_handler_raises_an_error_that_says_where(shards, bad):
    ds = wds.WebDataset([shards["good1"], shards[bad], shards["good2"]], shardshuffle=False)
    with pytest.raises(wds.ShardStreamError) as info:
        list(ds)
    exc = info.value
    assert exc.url == shards[bad]
    assert shards[bad] in str(exc)
    if bad == "missing":
        assert isinstance(exc, FileNotFoundError)
    else:
        assert isinstance(exc, wds.FormatError) and exc.offset is not None
    if bad == "corrupt":  # (the member is unknown: its header is what is broken; the one before it is named)
        assert exc.offset == shards["offset6"] and "after member 's0001.cls'" in str(exc)


@pytest.mark.parametrize("bad", ["truncated", "corrupt", "notar", "empty", "missing"])
def test_warn_and_continue_skips_the_bad_shard(shards, bad):
    ds = wds.WebDataset([shards["good1"], shards[bad], shards["good2"]], shardshuffle=False, handler=wds.warn_and_continue)
    with pytest.warns(UserWarning):
        samples = list(ds)
    keys = [s["__key__"] for s in samples]
    good = [f"s{i:04d}" for i in range(5)] + [f"s{i:04d}" for i in range(10, 15)]
    for k in good:
        assert k in keys
    # Whatever came from the bad shard is complete: every sample has all four fields.
    for s in samples:
        assert {"jpg", "cls", "json", "txt"} <= set(s), s["__key__"]


def test_duplicate_field_is_a_format_error_with_member_and_offset(tmp_path):
    path = write_tar(str(tmp_path / "dup.tar"), [("a.txt", b"1"), ("a.txt", b"2")])
    with pytest.raises(wds.FormatError) as info:
        list(wds.WebDataset(path, shardshuffle=False))
    assert info.value.member == "a.txt" and info.value.offset == 1024


@pytest.mark.parametrize("field", ["__key__", "__url__", "__local_path__"])
def test_a_member_named_like_a_field_the_reader_sets_is_a_duplicate(tmp_path, field):
    """`a.__key__` would overwrite the sample's key (or URL, or local path): webdataset calls it a
    duplicate file name, and so do we; a continuing handler keeps the rest of the sample."""
    path = write_tar(str(tmp_path / "fields.tar"), [(f"a.{field}", b"zz"), ("a.txt", b"1"), ("b.txt", b"2")])
    with pytest.raises(wds.FormatError, match="duplicate") as info:
        list(wds.WebDataset(path, shardshuffle=False))
    assert info.value.member == f"a.{field}" and info.value.offset == 0
    with pytest.warns(UserWarning, match="duplicate"):
        samples = list(wds.WebDataset(path, shardshuffle=False, handler=wds.warn_and_continue))
    assert [(s["__key__"], s["__url__"], s["__local_path__"], s["txt"]) for s in samples] == [
        ("a", path, path, b"1"), ("b", path, path, b"2")]


def test_pipe_urls_are_refused_unless_enabled(tmp_path, shards, monkeypatch):
    url = f"pipe:cat {shards['good1']}"
    with pytest.raises(wds.UsageError, match="allow_pipe"):
        list(wds.WebDataset(url, shardshuffle=False))
    assert len(list(wds.WebDataset(url, shardshuffle=False, allow_pipe=True))) == 5
    monkeypatch.setenv("SHARDSTREAM_ALLOW_PIPE", "1")
    assert len(list(wds.WebDataset(url, shardshuffle=False))) == 5
    monkeypatch.delenv("SHARDSTREAM_ALLOW_PIPE")
    wds.allow_pipe(True)
    try:
        assert len(list(wds.WebDataset(url, shardshuffle=False))) == 5
        with wds.gopen(url) as stream:
            assert stream.read(512)
    finally:
        wds.allow_pipe(False)
    with pytest.raises(wds.UsageError):
        wds.gopen(url)


def test_a_pipe_spec_runs_only_the_commands_it_names(tmp_path, shards, monkeypatch):
    """Counting the shards of a split (world size 2) looked for a sizes.json "beside" each URL:
    the command cut at its last `/` + "/sizes.json", run as a shell command the user never
    wrote (`... | tee /copies/x.tar` would have written /copies/sizes.json). So did `verify`."""
    log, script = tmp_path / "ran.log", tmp_path / "log.sh"
    script.write_text(f'echo "$*" >> {log}\ncat "$1"\n')
    spec = [f"pipe:sh {script} {shards[name]}" for name in ("good1", "good2")]
    monkeypatch.setenv("SHARDSTREAM_ALLOW_PIPE", "1")
    monkeypatch.setattr("shardstream._fetch.open._pipe_switch", None)  # (allow_pipe(False) before: the env decides)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (no counts: webdataset's split, with a warning)
        assert len(list(wds.WebDataset(spec, shardshuffle=False, nodesplitter=wds.split_by_node))) == 5
    from shardstream.cli import main

    assert main(["verify", "-q", "::".join(spec)]) == 0
    ran = log.read_text().split("\n")[:-1]
    assert sorted(set(ran)) == [shards["good1"], shards["good2"]], ran


def test_failing_pipe_command_is_an_error(tmp_path):
    url = f"pipe:cat {tmp_path}/nope.tar"
    with pytest.raises(wds.ShardStreamError):
        list(wds.WebDataset(url, shardshuffle=False, allow_pipe=True))


def test_a_chained_fsspec_url_reads_through_gopen_and_the_loader(tmp_path, shards):
    """`zip://inner/a.tar::file:///d/z.zip`: fsspec closes the file when its OpenFile is
    collected, which was dropped at once: "seek of closed file", a ValueError naming no URL."""
    import zipfile

    with zipfile.ZipFile(tmp_path / "z.zip", "w") as z:
        z.write(shards["good1"], "inner/good1.tar")
    url = f"zip://inner/good1.tar::file://{tmp_path}/z.zip"  # (in a list: `::` splits a string spec)
    with open(shards["good1"], "rb") as f:
        data = f.read()
    with wds.gopen(url) as stream:
        assert stream.read() == data
    samples = list(wds.WebDataset([url], shardshuffle=False))
    assert [s["__key__"] for s in samples] == [f"s{i:04d}" for i in range(5)]


@pytest.mark.skipif(importlib.util.find_spec("gcsfs") is not None, reason="gcsfs is installed")
def test_a_scheme_whose_fsspec_package_is_missing_is_a_usage_error_naming_the_url():
    with pytest.raises(wds.UsageError, match="gcsfs") as info:
        list(wds.WebDataset("gs://bucket/x.tar", shardshuffle=False))
    assert info.value.url == "gs://bucket/x.tar"
    with pytest.raises(wds.UsageError, match="gcsfs"):
        wds.gopen("gs://bucket/x.tar", "wb")


def test_writing_to_an_http_url_is_a_usage_error_that_says_what_to_do():
    """webdataset uploads with `curl -T`; gopen raised a bare NotImplementedError('')."""
    url = "http://user:Zq9secret@127.0.0.1:9/out.tar"
    for write in (lambda: wds.gopen(url, "wb"), lambda: wds.TarWriter(url)):
        with pytest.raises(wds.UsageError, match="pipe:curl -s -T -") as info:
            write()
        assert "Zq9secret" not in str(info.value)


def test_fsspec_urls_work(shards):
    import fsspec

    with fsspec.open("memory://bucket/good1.tar", "wb") as f:
        f.write(open(shards["good1"], "rb").read())
    samples = list(wds.WebDataset("memory://bucket/good1.tar", shardshuffle=False))
    assert [s["__key__"] for s in samples] == [f"s{i:04d}" for i in range(5)]
    assert "__local_path__" not in samples[0]
    with pytest.raises(wds.ShardNotFound):
        list(wds.WebDataset("memory://bucket/nothere.tar", shardshuffle=False))


def test_a_shard_cut_at_a_member_boundary_is_read_with_a_warning(tmp_path, caplog):
    """A shard that ends at a block boundary without the end-of-archive blocks reads as
    webdataset reads it (its samples, the last one perhaps short of members), and a WARNING
    names it and the byte where it stops: a shard cut there used to pass in silence."""
    import logging
    import tarfile

    import webdataset
    from shardserver import ShardServer

    whole = write_tar(str(tmp_path / "whole.tar"), [m for i in range(3) for m in sample_members(i)])
    with tarfile.open(whole) as archive:
        members = archive.getmembers()
        cut_at = members[-2].offset  # before the last sample's last two members
    cut = tmp_path / "cut.tar"
    cut.write_bytes(open(whole, "rb").read()[:cut_at])
    expected = [sorted(k for k in s if not k.startswith("__")) for s in webdataset.WebDataset(str(cut), shardshuffle=False)]
    with ShardServer(str(tmp_path)) as served:
        for url in (str(cut), served.url("cut.tar")):
            caplog.clear()
            with caplog.at_level(logging.WARNING):
                got = [sorted(k for k in s if not k.startswith("__")) for s in wds.WebDataset(url, shardshuffle=False)]
            assert got == expected and len(got[-1]) < len(got[0])
            told = [r.getMessage() for r in caplog.records if "end-of-archive" in r.getMessage()]
            assert len(told) == 1 and url in told[0] and f"at byte {cut_at}" in told[0], told
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        list(wds.WebDataset(whole, shardshuffle=False))
    assert not [r for r in caplog.records if "end-of-archive" in r.getMessage()]


@needs_torch
def test_an_error_from_a_dataloader_worker_keeps_its_location(tmp_path):
    """torch's DataLoader rebuilds a worker's exception from its text: the url, member and
    offset attributes came back None. A note carries them across as JSON, read back as torch
    rebuilds the error: through WebLoader and through a plain torch DataLoader."""
    good = write_tar(str(tmp_path / "good.tar"), [m for i in range(3) for m in sample_members(i)])
    whole = write_tar(str(tmp_path / "whole.tar"), [m for i in range(50, 53) for m in sample_members(i)])
    raw = open(whole, "rb").read()
    bad = tmp_path / "cut.tar"
    bad.write_bytes(raw[: len(raw) // 2 + 100])
    from torch.utils.data import DataLoader

    def drain(loader):
        it = iter(loader)
        try:
            for _ in it:
                pass
        finally:  # torch's own iterator leaves its workers to a garbage collection (see below)
            getattr(it, "_shutdown_workers", lambda: None)()

    seen = {}
    for loader, workers in ((wds.WebLoader, 0), (wds.WebLoader, 2), (DataLoader, 2)):
        dataset = wds.WebDataset([good, str(bad)], shardshuffle=False).to_tuple("__key__")
        with pytest.raises(wds.FormatError) as caught:
            drain(loader(dataset, num_workers=workers, batch_size=None))
        assert "Caught FormatError in DataLoader worker" in str(caught.value) or not workers  # torch rebuilt it
        seen[loader, workers] = (caught.value.url, caught.value.member, caught.value.offset)
    assert len(set(seen.values())) == 1, seen
    assert seen[wds.WebLoader, 0][0] == str(bad) and seen[wds.WebLoader, 0][2] is not None, seen
    # a DecodingError (url, key, field) takes torch's text as its url when rebuilt: put right too
    badjson = write_tar(str(tmp_path / "badjson.tar"), [("s0000.json", b'{"a": 1}'), ("s0001.json", b"{not json")])
    decoded = {}
    for loader, workers in ((wds.WebLoader, 0), (wds.WebLoader, 1), (DataLoader, 1)):
        with pytest.raises(wds.DecodingError) as caught:
            drain(loader(wds.WebDataset(badjson, shardshuffle=False).decode(), batch_size=None, num_workers=workers))
        error = caught.value
        decoded[loader, workers] = (error.url, error.member, error.key, error.k)
    assert set(decoded.values()) == {(badjson, "s0001.json", "s0001", "json")}, decoded


@pytest.mark.parametrize("batch_size", [None, 2])
@needs_torch
def test_a_webloader_whose_worker_failed_lets_its_workers_go_at_once(tmp_path, batch_size):
    """torch shuts its workers down when its iterator ends, not when it re-raises a worker's
    error; the re-raise leaves the iterator in a reference cycle, so they lived on until a garbage
    collection, whose finalizer then held the thread it ran in ~5 s (in the test suite: an HTTP
    server's event loop, which answered nothing for 10 s). WebLoader lets them go as it raises."""
    import gc
    import multiprocessing

    good = write_tar(str(tmp_path / "good.tar"), [m for i in range(3) for m in sample_members(i)])
    raw = open(write_tar(str(tmp_path / "whole.tar"), [m for i in range(9) for m in sample_members(i)]), "rb").read()
    (tmp_path / "cut.tar").write_bytes(raw[: len(raw) // 2 + 100])
    dataset = wds.WebDataset([good, str(tmp_path / "cut.tar")], shardshuffle=False).to_tuple("__key__")
    gc.disable()  # (the cycle stays uncollected, as it does between a program's collections)
    try:
        with pytest.raises(wds.FormatError):
            list(wds.WebLoader(dataset, num_workers=2, batch_size=batch_size))
        assert multiprocessing.active_children() == []  # (it joins the finished ones)
    finally:
        gc.enable()


def _corrupt(sample):
    from shardstream._cache.check import CorruptCacheFile

    raise CorruptCacheFile("block 3 failed its digest", cache_path="/cache/x.tar", url="http://h/x.tar",
                           reason="digest mismatch")


@needs_torch
def test_location_notes_are_read_back_only_from_torch_text_and_the_last_one_wins(tmp_path):
    """The location note is read back only from the text torch rebuilds a worker's error from,
    and from the error's own note (torch prints its causes first); an error whose class takes
    more than a message (CorruptCacheFile) is rebuilt by torch too, with its cache path."""
    from torch.utils.data import DataLoader

    note = 'shardstream-where: {"url": "http://elsewhere/x.tar", "member": "m", "offset": 7}'
    assert wds.UsageError(f"bad option\n{note}").url is None  # not torch's text: nothing read
    text = ("Caught FormatError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
            '  ...\nshardstream._base.errors.FormatError: inner\nshardstream-where: {"url": "http://a/inner.tar", '
            '"member": "i.bin", "offset": 1}\n\nThe above exception was the direct cause of the following exception:\n'
            '  ...\nshardstream._base.errors.FormatError: outer\nshardstream-where: {"url": "http://b/outer.tar", '
            '"member": "o.bin", "offset": 2}\n')
    rebuilt = wds.FormatError(text)
    assert (rebuilt.url, rebuilt.member, rebuilt.offset) == ("http://b/outer.tar", "o.bin", 2)
    good = write_tar(str(tmp_path / "good.tar"), [m for i in range(3) for m in sample_members(i)])
    it = iter(DataLoader(wds.WebDataset(good, shardshuffle=False).map(_corrupt), batch_size=None, num_workers=1))
    try:
        with pytest.raises(wds.FetchError) as caught:
            next(it)
    finally:
        it._shutdown_workers()
    error = caught.value
    assert type(error).__name__ == "CorruptCacheFile" and "Caught CorruptCacheFile" in str(error)
    assert (error.url, error.cache_path, error.reason) == ("http://h/x.tar", "/cache/x.tar", "digest mismatch")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("handler", ["warn_and_continue", "ignore_and_continue"])
def test_resampled_draws_from_shards_that_all_fail_end_with_an_error(shards, handler):
    """Drawing with replacement never runs out of shards: once every shard it draws from has
    failed since the last sample, the pass raises instead of drawing them again forever."""
    bad = [shards[name] for name in ("notar", "empty", "missing")]  # (truncated and corrupt ones have samples)
    ds = wds.WebDataset(bad, resampled=True, handler=getattr(wds, handler), seed=3).with_epoch(10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(wds.ShardStreamError, match="all 3 shards that resampled draws come from failed"):
            list(ds)
    # One good shard among them: the pass goes on as long as it is asked to.
    ds = wds.WebDataset(bad + [shards["good1"]], resampled=True, handler=getattr(wds, handler), seed=3).with_epoch(40)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        samples = list(ds)
    assert len(samples) == 40 and all(s["__key__"] in {f"s{i:04d}" for i in range(5)} for s in samples)


@pytest.mark.parametrize("option", ["rename_files", "select_files", "rename_files returns None"])
def test_a_file_callbacks_error_names_the_member_and_shard(tmp_path, option):
    """rename_files and select_files know nothing of the shard: their error carries a note naming
    the member, its offset and the URL (a rename_files that returns None says so, instead of an
    AttributeError from inside the reader); under a continuing handler the member is skipped."""
    path = write_tar(str(tmp_path / "cb.tar"), [("s0.txt", b"a"), ("s0.json", b"{}"), ("s1.txt", b"b")])

    def boom(name):
        if name.endswith(".json"):
            raise ZeroDivisionError("boom")
        return name if option == "rename_files" else True

    callbacks = {"rename_files": {"rename_files": boom}, "select_files": {"select_files": boom},
                 "rename_files returns None": {"rename_files": lambda n: None if n.endswith(".json") else n}}[option]
    with pytest.raises(Exception) as info:
        list(wds.WebDataset(path, shardshuffle=False, **callbacks))
    expected = TypeError if option.endswith("None") else ZeroDivisionError
    assert type(info.value) is expected
    assert "shardstream: on member 's0.json' at byte 1024 of " + path in info.value.__notes__
    if expected is TypeError:
        assert "rename_files returned None for member 's0.json'" in str(info.value)
    samples = list(wds.WebDataset(path, shardshuffle=False, handler=wds.ignore_and_continue, **callbacks))
    assert [sorted(k for k in s if not k.startswith("__")) for s in samples] == [["txt"], ["txt"]]


@pytest.mark.parametrize("where", ["local", "http"])
def test_a_long_run_of_zeros_mid_shard_does_not_hide_the_samples_after_it(tmp_path, where):
    """1 MiB of zero blocks where a header is due (a damaged shard; or `cat a.tar b.tar` with a
    `tar -b 256` first archive): a valid header after them was looked for within 64 KiB only, so
    the samples after were lost with no error and `verify` passed. A shard of known length is
    looked at to its end."""
    from shardstream.cli import main

    members = [m for i in range(6) for m in sample_members(i)]
    whole = tmp_path / "whole.tar"
    write_tar(str(whole), members)
    cut = 512 * sum(1 + (len(m[1]) + 511) // 512 for m in members[: len(members) // 2])  # at sample 3's header
    raw = whole.read_bytes()
    damaged = tmp_path / "damaged.tar"
    damaged.write_bytes(raw[:cut] + bytes(1 << 20) + raw[cut:])
    url = str(damaged)
    if where == "http":
        from shardserver import ShardServer

        server = ShardServer(str(tmp_path)).__enter__()
        url = server.url("damaged.tar")
    try:
        keys = []
        with pytest.raises(wds.FormatError, match="after the end-of-archive block"):
            keys.extend(s["__key__"] for s in wds.WebDataset(url, shardshuffle=False))
        assert keys == ["s0000", "s0001", "s0002"]
    finally:
        if where == "http":
            server.__exit__(None, None, None)
    assert main(["verify", "-q", str(damaged)]) == 1
