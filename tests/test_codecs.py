"""bzip2 and xz shards (`_codecs`): read like gzip ones, locally, over HTTP and by the CLI, and
written by TarWriter; corrupt and truncated streams are format errors."""

from __future__ import annotations

import io
import tarfile

import pytest

import shardstream as wds
from shardstream._tar.codecs import sniff
from shardstream._base.errors import FormatError
from shardstream._tar.reader import TarReader
from shardstream.cli import main

from tarvectors import VECTORS

SUFFIXES = ["tar", "tar.gz", "tar.bz2", "tar.xz"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """One shard per codec, written by TarWriter (it picks the codec from the name)."""
    root = tmp_path_factory.mktemp("codecs")
    for suffix in SUFFIXES:
        with wds.TarWriter(str(root / f"shard.{suffix}")) as sink:
            for i in range(5):
                sink.write({"__key__": f"s{i:03d}", "txt": f"text {i}", "cls": i})
    return str(root), None


def _samples(url):
    return [(s["__key__"], s["txt"], s["cls"]) for s in wds.WebDataset(url, shardshuffle=False).decode()]


EXPECTED = [(f"s{i:03d}", f"text {i}", i) for i in range(5)]


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_every_codec_round_trips_locally(files, suffix):
    assert _samples(f"{files[0]}/shard.{suffix}") == EXPECTED


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_every_codec_streams_over_http(server, suffix):
    assert _samples(server.url(f"shard.{suffix}")) == EXPECTED


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_verify_and_index_read_every_codec(files, suffix, capsys):
    assert main(["verify", f"{files[0]}/shard.{suffix}"]) == 0
    assert '"samples": 5' in capsys.readouterr().out


@pytest.mark.parametrize("suffix", [".bz2", ".xz"])
def test_truncated_streams_are_format_errors(suffix):
    archive = VECTORS["ustar_small" + suffix]
    reader = TarReader("http://h/x.tar" + suffix)
    with pytest.raises(FormatError, match="truncated (bzip2|xz) stream") as caught:
        reader.feed(archive[: len(archive) - 7])
        reader.close()
    assert caught.value.url == "http://h/x.tar" + suffix


@pytest.mark.parametrize("suffix", [".bz2", ".xz"])
def test_corrupt_streams_are_format_errors(suffix):
    archive = bytearray(VECTORS["pax_unicode" + suffix])
    middle = len(archive) // 2
    archive[middle : middle + 16] = bytes(16)
    with pytest.raises(FormatError, match="corrupt (bzip2|xz) stream|truncated|checksum"):
        reader = TarReader("x")
        reader.feed(bytes(archive))
        reader.close()


def test_a_plain_tar_that_begins_like_bzip2_is_still_a_tar():
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo("BZh9-notes.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    data = buf.getvalue()
    assert sniff(data[:10]) == (None, True)
    reader = TarReader()
    assert [m.name for m in reader.feed(data) + reader.close()] == ["BZh9-notes.txt"]


@pytest.mark.parametrize("head, decided", [(b"", False), (b"\x1f", False), (b"BZh9", False), (b"\xfd7z", False),
                                           (b"BZx", True), (b"ab", True), (b"\x1f\x8b", True)])
def test_sniff_waits_only_while_a_magic_is_possible(head, decided):
    assert sniff(head)[1] is decided
