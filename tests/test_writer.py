"""Tests for shardstream.writer: tars must read back with webdataset 1.0.2 and stdlib tarfile, and
match what webdataset's own TarWriter / ShardWriter write for the same samples.
"""

from __future__ import annotations

import glob
import gzip
import io
import json
import os
import pickle
import sys
import tarfile

import fsspec
import msgpack
import numpy as np
import PIL.Image
import pytest
import webdataset as wds
import webdataset.writer as ww

import shardstream.writer as sw
from shardstream._decode import tenbin as _tenbin
from shardstream._base.errors import UsageError

MTIME = 1_700_000_000

HEADER_FIELDS = ("name", "size", "mode", "uid", "gid", "uname", "gname", "type", "linkname", "pax_headers")


def rng(seed=0):
    return np.random.default_rng(seed)


def make_samples(n=6, gz=True):
    """Samples with one value of every kind the default encoders handle.

    gz=False leaves out the ".gz" field, whose gzip header holds the time it was compressed.
    """
    samples = []
    for i in range(n):
        r = rng(i)
        samples.append(
            {
                "__key__": f"dir/sample{i:04d}",
                "png": r.integers(0, 256, (9, 7, 3), dtype=np.uint8),
                "gray.png": r.integers(0, 256, (5, 4), dtype=np.uint8),
                "float.png": r.random((4, 6, 3)),
                "jpg": r.integers(0, 256, (16, 16, 3), dtype=np.uint8),
                "pil.png": PIL.Image.fromarray(r.integers(0, 256, (3, 3, 3), dtype=np.uint8)),
                "ppm": r.integers(0, 256, (3, 5, 3), dtype=np.uint8),
                "tiff": r.integers(0, 256, (3, 5, 3), dtype=np.uint8),
                "npy": r.random((2, 3)),
                "npz": {"a": np.arange(i + 1), "b": np.eye(2)},
                "json": {"index": i, "tags": ["x", "ü"]},
                "txt": f"caption number {i} ü",
                "cls": i % 3,
                "id": i,
                "mp": {"i": i, "l": [1, 2]},
                "ten": [np.arange(4, dtype=np.float32) + i],
                "pyd": {"python": (i, "object")},
                "bin": bytes([i]) * 5,
                "json.gz": {"compressed": True},
                "__url__": "ignored-without-keep-meta",
                "_private": "also ignored",
            }
        )
        if not gz:
            del samples[-1]["json.gz"]
    return samples


def n_fields(sample):
    return len([k for k in sample if not k.startswith("_")])


def members(data: bytes):
    """(TarInfo, payload) pairs of an (optionally gzip-compressed) tar in memory."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return [(info, tar.extractfile(info).read()) for info in tar.getmembers()]


def comparable_payload(name, payload):
    # gzip headers hold the compression time, so compare what they decompress to.
    return gzip.decompress(payload) if name.endswith(".gz") else payload


def assert_same_members(ours: bytes, theirs: bytes, fields=HEADER_FIELDS + ("mtime",)):
    ours_m, theirs_m = members(ours), members(theirs)
    assert [i.name for i, _ in ours_m] == [i.name for i, _ in theirs_m]
    for (oi, op), (ti, tp) in zip(ours_m, theirs_m):
        for field in fields:
            if field == "pax_headers" and "mtime" not in fields:
                ours_pax = {k: v for k, v in oi.pax_headers.items() if k != "mtime"}
                assert ours_pax == {k: v for k, v in ti.pax_headers.items() if k != "mtime"}, oi.name
            else:
                assert getattr(oi, field) == getattr(ti, field), (oi.name, field)
        assert comparable_payload(oi.name, op) == comparable_payload(ti.name, tp), oi.name


def write_both(samples, **kw):
    """Write `samples` into memory with each library's TarWriter; return (ours, theirs, sizes)."""
    outputs, sizes = [], []
    for module in (sw, ww):
        stream = io.BytesIO()
        writer = module.TarWriter(stream, **kw)
        sizes.append([writer.write(dict(s)) for s in samples])
        writer.close()
        outputs.append(stream.getvalue())
    return outputs[0], outputs[1], sizes


# --- TarWriter against webdataset's TarWriter ------------------------------------------------------


def test_tar_is_byte_identical_to_webdataset_with_fixed_mtime():
    ours, theirs, (our_sizes, their_sizes) = write_both(make_samples(gz=False), mtime=MTIME)
    assert our_sizes == their_sizes
    assert_same_members(ours, theirs)
    assert ours == theirs
    ours, theirs, (our_sizes, their_sizes) = write_both(make_samples(3), mtime=MTIME)
    assert our_sizes == their_sizes
    assert_same_members(ours, theirs)


def test_members_and_headers_match_webdataset_with_live_mtime():
    options = dict(user="alice", group="staff", mode=0o640, keep_meta=True)
    # (with keep_meta, a __url__ field is refused: the reader sets it; see test_keep_meta_refuses_...)
    samples = [{k: v for k, v in s.items() if k != "__url__"} for s in make_samples(2)]
    ours, theirs, _ = write_both(samples, **options)
    # Live mtimes are floats: both write them in PAX headers; the times themselves differ.
    assert_same_members(ours, theirs, fields=HEADER_FIELDS)
    names = [info.name for info, _ in members(ours)]
    assert "dir/sample0000._private" in names
    info = members(ours)[0][0]
    assert (info.uname, info.gname, info.mode, info.uid) == ("alice", "staff", 0o640, 0)
    assert "mtime" in info.pax_headers


def test_payloads_decode_to_the_original_values():
    sample = make_samples(1)[0]
    tar = write_both([sample], mtime=MTIME)[0]
    payload = {info.name.split(".", 1)[1]: data for info, data in members(tar)}
    assert json.loads(payload["json"]) == sample["json"]
    assert payload["txt"].decode("utf-8") == sample["txt"]
    assert int(payload["cls"]) == sample["cls"]
    assert msgpack.unpackb(payload["mp"]) == sample["mp"]
    assert pickle.loads(payload["pyd"]) == sample["pyd"]
    np.testing.assert_array_equal(np.load(io.BytesIO(payload["npy"])), sample["npy"])
    np.testing.assert_array_equal(_tenbin.decode_buffer(payload["ten"])[0], sample["ten"][0])
    np.testing.assert_array_equal(np.asarray(PIL.Image.open(io.BytesIO(payload["png"]))), sample["png"])
    assert json.loads(gzip.decompress(payload["json.gz"])) == {"compressed": True}
    assert payload["bin"] == sample["bin"]


@pytest.mark.parametrize(
    "compress, magic", [(True, b"\x1f\x8b"), ("gz", b"\x1f\x8b"), ("bz2", b"BZh"), ("xz", b"\xfd7zXZ")]
)
def test_compressed_tars_match_webdataset(compress, magic):
    ours, theirs, _ = write_both(make_samples(2), mtime=MTIME, compress=compress)
    assert ours.startswith(magic) and theirs.startswith(magic)
    assert_same_members(ours, theirs)


@pytest.mark.parametrize("ustar", ["USTAR_FORMAT", tarfile.USTAR_FORMAT])  # (the constant is 0)
def test_tar_format_is_honoured(ustar):
    stream = io.BytesIO()
    with sw.TarWriter(stream, format=ustar, mtime=1234.5) as writer:
        writer.write({"__key__": "k", "txt": "x"})
    info, payload = members(stream.getvalue())[0]
    assert info.pax_headers == {} and info.mtime == 1234 and payload == b"x"
    for name in ("ustar", "gnu", "pax", tarfile.GNU_FORMAT):
        sw.TarWriter(io.BytesIO(), format=name).close()
    with pytest.raises(UsageError):
        sw.TarWriter(io.BytesIO(), format="zip")


def test_encoder_options_match_webdataset():
    raw = [{"__key__": "a", "txt": b"bytes only", "__url__": "meta as str"}]
    ours, theirs, _ = write_both(raw, encoder=False, mtime=MTIME)
    assert ours == theirs
    for module in (sw, ww):
        with pytest.raises(ValueError):
            module.TarWriter(io.BytesIO(), encoder=False).write({"__key__": "a", "txt": "a str"})
        with pytest.raises(ValueError):
            module.TarWriter(io.BytesIO()).write({"txt": "no key"})
        with pytest.raises(ValueError):
            module.TarWriter(io.BytesIO()).write({"__key__": "a", "unknownext": 3})
        with pytest.raises(ValueError):
            module.TarWriter(io.BytesIO()).write({"__key__": 3, "txt": "key is no str"})

    def upper(sample):
        return {k: (v.upper() if isinstance(v, bytes) else v) for k, v in sample.items()}

    ours, theirs, _ = write_both([{"__key__": "a", "txt": b"abc"}], encoder=upper, mtime=MTIME)
    assert ours == theirs and members(ours)[0][1] == b"ABC"
    custom = {"txt": lambda x: x.encode("utf-8"), "num": lambda x: b"%d!" % x}
    ours, theirs, _ = write_both([{"__key__": "a", "num": 5, "txt": "t"}], encoder=custom, mtime=MTIME)
    assert ours == theirs and members(ours)[0][1] == b"5!"


def test_encoders_match_webdataset_for_every_extension():
    value = {
        "cls class count index inx id": 42,
        "txt text transcript html htm": "text ü",
        "json jsn": {"a": [1, None]},
        "mp msgpack msg": [1, "x"],
        "npy": np.arange(6).reshape(2, 3),
        "ten tenbin tb": np.ones((2, 2), dtype=np.uint8),
        "jpg jpeg img image png ppm tiff tif": rng(3).integers(0, 256, (5, 5, 3), dtype=np.uint8),
        "pyd pickle": {"x": 1},
    }
    for extensions, data in value.items():
        for ext in extensions.split():
            ours = bytes(sw.default_handlers[ext](data))
            theirs = bytes(ww.default_handlers[ext](data))
            assert ours == theirs, ext
    assert sorted(sw.default_handlers) == sorted(ww.default_handlers)


def test_image_encoder_rejects_out_of_range_floats_and_writes_netpbm():
    with pytest.raises(ValueError):
        sw.imageencoder(np.full((2, 2), 2.0))
    with pytest.raises(ValueError):
        ww.imageencoder(np.full((2, 2), 2.0))
    image = rng(1).integers(0, 256, (4, 6, 3), dtype=np.uint8)
    for ext, mode in (("pbm", "1"), ("pgm", "L")):
        decoded = PIL.Image.open(io.BytesIO(sw.default_handlers[ext](image)))
        assert (decoded.mode, decoded.size) == (mode, (6, 4))


def test_numpy_and_torch_dumps_match_webdataset():
    array = rng(2).random((3, 4))
    assert sw.numpy_dumps(array) == ww.numpy_dumps(array)
    torch = pytest.importorskip("torch")
    tensor = torch.arange(5)
    loaded = torch.load(io.BytesIO(sw.torch_dumps({"t": tensor})), weights_only=True)
    assert torch.equal(loaded["t"], tensor)
    assert bytes(sw.tenbin_dumps(array)) == bytes(ww.tenbin_dumps(array))


# --- destinations -----------------------------------------------------------------------------------


def test_local_path_url_and_file_url(tmp_path):
    for target in (str(tmp_path / "a.tar"), "file://" + str(tmp_path / "b.tar"), tmp_path / "c.tar"):
        with sw.TarWriter(target, mtime=MTIME) as writer:
            writer.write({"__key__": "k", "txt": "hello"})
    for name in ("a.tar", "b.tar", "c.tar"):
        assert [(i.name, p) for i, p in members((tmp_path / name).read_bytes())] == [("k.txt", b"hello")]


def test_gz_file_name_compresses_like_webdataset(tmp_path):
    for module, name in ((sw, "ours.tar.gz"), (ww, "theirs.tar.gz")):
        with module.TarWriter(str(tmp_path / name), mtime=MTIME) as writer:
            for sample in make_samples(2):
                writer.write(sample)
    ours, theirs = (tmp_path / "ours.tar.gz").read_bytes(), (tmp_path / "theirs.tar.gz").read_bytes()
    assert ours[:2] == b"\x1f\x8b"
    assert_same_members(ours, theirs)


def test_fsspec_memory_url():
    fs = fsspec.filesystem("memory")
    with sw.TarWriter("memory://writer-test/one.tar", mtime=MTIME) as writer:
        writer.write({"__key__": "k", "json": {"a": 1}})
    assert members(fs.cat("/writer-test/one.tar"))[0][1] == b'{"a": 1}'
    with sw.ShardWriter("memory://writer-test/shard-%02d.tar", maxcount=2, verbose=0) as writer:
        for sample in make_samples(5):
            writer.write(sample)
    names = sorted(fs.ls("/writer-test", detail=False))
    assert [n.rsplit("/", 1)[1] for n in names] == ["one.tar", "shard-00.tar", "shard-01.tar", "shard-02.tar"]
    fs.rm("/writer-test", recursive=True)


def test_pipe_destination_is_refused():
    with pytest.raises(UsageError, match="pipe:"):
        sw.TarWriter("pipe:cat > /dev/null")


def test_stdout_destination_is_flushed_not_closed(monkeypatch):
    class FakeStdout:
        buffer = io.BytesIO()

    monkeypatch.setattr(sys, "stdout", FakeStdout)
    with sw.TarWriter("-", mtime=MTIME) as writer:
        writer.write({"__key__": "k", "txt": "to stdout"})
    assert not FakeStdout.buffer.closed
    assert members(FakeStdout.buffer.getvalue())[0][1] == b"to stdout"


# --- ShardWriter -----------------------------------------------------------------------------------


def shard_layout(pattern):
    """{shard file name: [member names]} for every shard matching a glob."""
    return {
        os.path.basename(path): [info.name for info, _ in members(open(path, "rb").read())]
        for path in sorted(glob.glob(pattern))
    }


def write_shards_both(tmp_path, samples, suffix=".tar", **kw):
    finished = {"ours": [], "theirs": []}
    for module, name in ((sw, "ours"), (ww, "theirs")):
        (tmp_path / name).mkdir()
        pattern = str(tmp_path / name / f"shard-%04d{suffix}")
        with module.ShardWriter(pattern, verbose=0, post=finished[name].append, **kw) as writer:
            for sample in samples:
                writer.write(dict(sample))
    ours = shard_layout(str(tmp_path / "ours" / f"*{suffix}"))
    theirs = shard_layout(str(tmp_path / "theirs" / f"*{suffix}"))
    return ours, theirs, finished


def test_shardwriter_maxcount_and_start_shard_match_webdataset(tmp_path):
    samples = make_samples(7, gz=False)
    ours, theirs, finished = write_shards_both(tmp_path, samples, maxcount=3, start_shard=5, mtime=MTIME)
    assert ours == theirs
    assert list(ours) == ["shard-0005.tar", "shard-0006.tar", "shard-0007.tar"]
    per_sample = n_fields(samples[0])
    assert [len(m) for m in ours.values()] == [3 * per_sample, 3 * per_sample, per_sample]
    assert [os.path.basename(f) for f in finished["ours"]] == list(ours)
    for name in ours:
        assert open(tmp_path / "ours" / name, "rb").read() == open(tmp_path / "theirs" / name, "rb").read()


def test_shardwriter_maxsize_matches_webdataset(tmp_path):
    samples = [{"__key__": f"s{i}", "bin": bytes(1000 + i)} for i in range(10)]
    ours, theirs, _ = write_shards_both(tmp_path, samples, maxsize=2500)
    assert ours == theirs
    assert [len(m) for m in ours.values()] == [3, 3, 3, 1]


def test_shardwriter_compressed_shards_read_back_with_webdataset(tmp_path):
    samples = make_samples(5)
    ours, theirs, _ = write_shards_both(tmp_path, samples, suffix=".tar.gz", maxcount=2, mtime=MTIME)
    assert ours == theirs and len(ours) == 3
    urls = sorted(glob.glob(str(tmp_path / "ours" / "*.tar.gz")))
    decoded = list(wds.WebDataset(urls, shardshuffle=False).decode("rgb8"))
    assert [d["__key__"] for d in decoded] == [s["__key__"] for s in samples]
    for got, sample in zip(decoded, samples):
        assert got["json"] == sample["json"] and got["txt"] == sample["txt"] and got["cls"] == sample["cls"]
        assert got["json.gz"] == sample["json.gz"]
        np.testing.assert_array_equal(got["npy"], sample["npy"])
        np.testing.assert_array_equal(got["png"], sample["png"])
        np.testing.assert_array_equal(got["gray.png"], np.repeat(sample["gray.png"][:, :, None], 3, axis=2))


def test_shardwriter_read_back_raw_with_webdataset(tmp_path):
    samples = [{"__key__": f"k{i}", "txt": f"t{i}", "cls": i} for i in range(4)]
    pattern = str(tmp_path / "raw-%d.tar")
    with sw.ShardWriter(pattern, maxcount=3, verbose=0, compress=True) as writer:
        for sample in samples:
            writer.write(sample)
    urls = [pattern % 0, pattern % 1]
    got = list(wds.WebDataset(urls, shardshuffle=False))
    assert [(g["__key__"], g["txt"], g["cls"]) for g in got] == [
        (f"k{i}", f"t{i}".encode(), str(i).encode()) for i in range(4)
    ]
    assert open(urls[0], "rb").read(2) == b"\x1f\x8b"


def test_shardwriter_opener_and_close(tmp_path):
    opened = []

    def opener(name):
        opened.append(name)
        return open(name, "wb")

    writer = sw.ShardWriter(str(tmp_path / "o-%d.tar"), maxcount=1, verbose=0, opener=opener)
    for i in range(2):
        writer.write({"__key__": str(i), "txt": "x"})
    writer.close()
    writer.close()  # idempotent (webdataset raises AttributeError)
    assert [os.path.basename(n) for n in opened] == ["o-0.tar", "o-1.tar"]
    with pytest.raises(UsageError):
        writer.write({"__key__": "late", "txt": "x"})


def test_shardwriter_logs_instead_of_printing(tmp_path, capsys, caplog):
    caplog.set_level("INFO", logger="shardstream._writer.tarwriter")
    with sw.ShardWriter(str(tmp_path / "v-%d.tar"), verbose=1) as writer:
        writer.write({"__key__": "k", "txt": "x"})
    assert capsys.readouterr().out == ""
    assert "v-0.tar" in caplog.text


@pytest.mark.parametrize("sample, message", [
    ({"__key__": "", "cls": b"1"}, "non-empty"),
    ({"__key__": "a\0b", "cls": b"1"}, "NUL"),
    ({"__key__": "dir/img.jpg", "cls": b"1"}, "'.' in it"),
    ({"__key__": "k", "": b"1"}, "non-empty strings, got ''"),
    ({"__key__": "k", "txt": b"a", "TXT": b"b"}, "read back as one"),
    ({"__key__": "__c__/d", "txt": b"1"}, "meta member"),
    ({"__key__": "__a", "txt__": b"1"}, "meta member"),
])
def test_names_a_reader_would_not_read_back_are_refused(tmp_path, sample, message):
    """webdataset writes these, and its reader (and ours) then cuts the key at the '.', drops
    the sample (an empty or NUL key) or fails on a duplicate: nothing is written instead."""
    path = str(tmp_path / "out.tar")
    with sw.TarWriter(path) as sink:
        with pytest.raises(UsageError, match=message):
            sink.write(sample)
        sink.write({"__key__": "dir/ok", "cls": b"1", "TXT": b"upper"})
    assert [(s["__key__"], s["txt"]) for s in wds.WebDataset(path, shardshuffle=False)] == [("dir/ok", b"upper")]


def test_names_are_checked_as_the_encoder_returns_them(tmp_path):
    """An encoder may rename: one that mends a key is written as webdataset writes it, one that
    breaks a key is refused (the check runs on what is written, not on what was passed)."""
    def mend(sample):
        return {k: (v.replace(".", "_") if k == "__key__" else v.encode()) for k, v in sample.items()}

    def spoil(sample):
        return {k: (v + ".v2" if k == "__key__" else v.encode()) for k, v in sample.items()}

    path = str(tmp_path / "out.tar")
    with sw.TarWriter(path, encoder=mend) as sink:
        sink.write({"__key__": "img.001", "txt": "a"})
    assert [s["__key__"] for s in wds.WebDataset(path, shardshuffle=False)] == ["img_001"]
    with sw.TarWriter(str(tmp_path / "spoilt.tar"), encoder=spoil) as sink:
        with pytest.raises(UsageError, match="'.' in it"):
            sink.write({"__key__": "a", "txt": "b"})


def test_keep_meta_refuses_the_fields_the_reader_sets(tmp_path):
    """Samples read from a shard carry __url__ and __local_path__; written back with keep_meta,
    they would clash with what the reader sets (our reader refuses the shard as a duplicate)."""
    source = str(tmp_path / "src.tar")
    with sw.TarWriter(source) as sink:
        sink.write({"__key__": "a", "txt": "x", "_note": "kept"})
    sample = next(iter(wds.WebDataset(source, shardshuffle=False)))
    with sw.TarWriter(str(tmp_path / "out.tar"), keep_meta=True) as sink:
        with pytest.raises(UsageError, match="'__url__' is one the reader sets"):
            sink.write(sample)
        sink.write({k: v for k, v in sample.items() if k not in ("__url__", "__local_path__")})
