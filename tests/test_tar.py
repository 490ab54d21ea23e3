"""The sans-IO tar reader: every vector whole, byte by byte and in random splits, against tarfile.

Chunk boundaries must never change the result, only `FormatError` may escape, and a member is
handed out only once all of its bytes are there.
"""

from __future__ import annotations

import ast
import gzip
import io
import pathlib
import random
import tarfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from shardsets import tar_bytes, zero_members
from tarvectors import NAMES, SMALL, VECTORS, patch_header, reference_members
import tarvectors

import shardstream._tar.reader
from shardstream._base.errors import FormatError
from shardstream._tar.reader import TarMember, TarReader

URL = "https://example.com/shards/train-000.tar"
_FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_reference_cache: dict = {}


def reference(name: str) -> list:
    if name not in _reference_cache:
        _reference_cache[name] = reference_members(VECTORS[name])
    return _reference_cache[name]


def read(chunks, **kwargs) -> list:
    """Feed `chunks` to a fresh reader, close it, return the members as plain tuples."""
    reader = TarReader(URL, **kwargs)
    members = []
    for chunk in chunks:
        members += reader.feed(chunk)
    members += reader.close()
    assert all(type(m) is TarMember for m in members)
    return [tuple(m) for m in members]


def split(data: bytes, cuts) -> list:
    cuts = sorted(cuts)
    return [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)])]


def feed_until_error(data: bytes, chunks=None, **kwargs):
    """Feed everything; return (members handed out, the FormatError or None)."""
    reader = TarReader(URL, **kwargs)
    members = []
    try:
        for chunk in chunks if chunks is not None else [data]:
            members += reader.feed(chunk)
        members += reader.close()
        reader.close()  # (an error kept back behind the last member: a cut in its padding)
    except FormatError as exc:
        return [tuple(m) for m in members], exc
    return [tuple(m) for m in members], None


def assert_located(exc: FormatError, offset: int, member=None) -> None:
    assert exc.url == URL and URL in str(exc)
    assert exc.offset == offset and f"offset={offset}" in str(exc)
    if member is not None:
        assert exc.member == member and repr(member) in str(exc)


# --- every vector, every way of chunking it -------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_vector_whole(name):
    assert read([VECTORS[name]]) == reference(name)


@pytest.mark.parametrize("name", SMALL)
def test_vector_byte_by_byte(name):
    data = VECTORS[name]
    assert read(data[i : i + 1] for i in range(len(data))) == reference(name)


@pytest.mark.parametrize("name", ["large_member", "large_member.gz"])
@pytest.mark.parametrize("chunk_size", [7, 511, 4096, 65537, 1 << 20])
def test_large_member_in_small_chunks(name, chunk_size):
    # Small chunks must not re-copy the pending member each time (quadratic): this stays fast.
    data = VECTORS[name]
    assert read(data[i : i + chunk_size] for i in range(0, len(data), chunk_size)) == reference(name)


@_FUZZ
@given(st.data())
def test_random_splits_give_the_same_members(data):
    name = data.draw(st.sampled_from(SMALL), label="vector")
    archive = VECTORS[name]
    cuts = data.draw(st.lists(st.integers(0, len(archive)), max_size=24), label="cuts")
    kind = data.draw(st.sampled_from([bytes, bytearray, memoryview]), label="chunk type")
    choices = [None, True] if name.endswith(".gz") else [None] if name.endswith((".bz2", ".xz")) else [None, False]
    compressed = data.draw(st.sampled_from(choices), label="compressed")
    chunks = [kind(c) for c in split(archive, cuts)]
    assert read(chunks, compressed=compressed) == reference(name)


@pytest.mark.parametrize("name", ["ustar_small", "ustar_small.gz", "no_eof", "empty_archive", "trailing_garbage"])
def test_offset_and_finished(name):
    archive = VECTORS[name]
    raw = gzip.decompress(archive) if name.endswith(".gz") else archive
    reader = TarReader(URL)
    assert (reader.offset, reader.finished) == (0, False)
    reader.feed(archive)
    reader.close()
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r|") as tf:
        members = list(tf)
    if name == "no_eof":
        assert not reader.finished and reader.offset == len(raw)
    else:
        # Stops right after the first end-of-archive block, as tarfile does; the rest is ignored.
        end = members[-1].offset_data + -(-members[-1].size // 512) * 512 if members else 0
        assert reader.finished and reader.offset == end + 512
        assert reader.feed(b"anything after the end") == [] and reader.offset == end + 512


def test_interface():
    assert TarMember._fields == ("name", "data", "offset")
    reader = TarReader(compressed=False)
    assert reader.feed(b"") == [] and reader.feed(bytearray()) == [] and reader.feed(memoryview(b"")) == []
    assert reader.feed(memoryview(VECTORS["multidot"])[:1024])[0] == TarMember("a.b.c.jpg", b"abc", 0)
    with pytest.raises(TypeError):
        TarReader(URL, True)  # compressed is keyword-only


def test_members_survive_reuse_of_the_callers_buffer():
    archive = VECTORS["multidot"]
    reader = TarReader(URL)
    chunk = bytearray(archive)
    members = reader.feed(chunk)
    chunk[:] = bytes(len(chunk))
    assert [tuple(m) for m in members] == reference("multidot")


# --- truncation ---------------------------------------------------------------------------


def _member_ends(raw: bytes) -> tuple:
    """([(entry, end offset of its padded data, end of its data)] for each entry tarfile lists,
    end of the end-of-archive block) for a raw tar."""
    ends = []
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r|") as tf:
        for info in tf:
            carries_data = info.isreg() or info.type not in tarfile.SUPPORTED_TYPES
            size = info.size if carries_data else 0
            ends.append((info, info.offset_data + -(-size // 512) * 512, info.offset_data + size))
    return ends, (ends[-1][1] if ends else 0) + 512


@pytest.mark.parametrize(
    "name", ["gnu_longnames", "pax_unicode", "special_members", "extension_order", "block_sizes", "link_with_size"]
)
def test_truncation_at_every_position(name):
    archive = VECTORS[name]
    ref = reference(name)
    entries, eof_end = _member_ends(archive)
    end_of = dict(zip([m[2] for m in ref], [data_end for info, _, data_end in entries if info.isreg()]))
    boundaries = {end for _, end, _ in entries}
    for cut in range(eof_end + 513):
        members, error = feed_until_error(archive[:cut])
        # Every member whose data is all there is handed out (as tarfile does, even when the cut
        # took some of its padding: then the error follows it), and no other.
        assert members == [m for m in ref if end_of[m[2]] <= cut], cut
        if cut in boundaries or cut >= eof_end - 512:  # (a cut inside the zero end blocks is too)
            assert error is None, (cut, error)
        else:
            assert error is not None, cut
            assert error.url == URL and error.offset is not None and error.offset <= cut


@pytest.mark.parametrize("name", ["special_members.gz", "gnu_longnames.gz"])
def test_truncated_gzip_at_every_position(name):
    archive = VECTORS[name]
    ref = reference(name)
    for cut in range(len(archive)):
        members, error = feed_until_error(archive[:cut])
        assert members == ref[: len(members)]
        assert error is not None and error.url == URL, cut
        assert "truncated gzip" in error.message or cut < 2, (cut, error)  # 0, 1: no gzip yet


# --- corrupt input: each error names the URL, the offset and (when known) the member ---------


def test_empty_input():
    for chunks in ([], [b""], [b"", bytearray()]):
        _, error = feed_until_error(b"", chunks)
        assert "empty file" in error.message
        assert_located(error, 0)
    _, error = feed_until_error(gzip.compress(b""))
    assert "empty file" in error.message


def test_truncated_header():
    ref = reference("ustar_small")
    offset = ref[3][2]
    members, error = feed_until_error(VECTORS["ustar_small"][: offset + 100])
    assert members == ref[:3]
    assert "truncated tar header" in error.message
    assert_located(error, offset)


def test_zeros_short_of_a_block_after_the_last_member_are_padding():
    """A writer that pads its last member with fewer zeros than a block loses nothing (tarfile
    reads it the same); a partial header that is not all zeros is still a truncated header."""
    data = VECTORS["ustar_small"]
    end = -(-len(data.rstrip(b"\0")) // 512) * 512  # where the end-of-archive blocks start
    for tail in (1, 100, 511):
        for chunks in ([data[:end] + bytes(tail)], [data[:end], bytes(tail)], [data[:end], *[b"\0"] * tail]):
            members, error = feed_until_error(b"", chunks)
            assert error is None and members == reference("ustar_small"), tail
    members, error = feed_until_error(data[:end] + bytes(99) + b"x")
    assert "truncated tar header" in error.message and members == reference("ustar_small")


def test_truncated_member_data():
    ref = reference("ustar_small")
    name, data, offset = ref[3]
    members, error = feed_until_error(VECTORS["ustar_small"][: offset + 512 + len(data) // 2])
    assert members == ref[:3]
    assert "truncated tar member" in error.message
    assert_located(error, offset, name)


def test_truncated_member_after_extension_headers():
    ref = reference("gnu_longnames")
    name, data, offset = ref[1]  # has a GNU longname header: the offset is that header's
    for cut in (offset + 1024 + 100, offset + 1024 + 512 + 100):  # in its header, in its data
        members, error = feed_until_error(VECTORS["gnu_longnames"][:cut])
        assert members == ref[:1]
        assert_located(error, offset, name)


@pytest.mark.parametrize("index", [0, 2])
def test_bad_checksum(index):
    archive = VECTORS["ustar_small"]
    ref = reference("ustar_small")
    offset = ref[index][2]
    corrupt = bytearray(archive)
    corrupt[offset + 3] ^= 0x01  # one bit of the name
    members, error = feed_until_error(bytes(corrupt))
    assert members == ref[:index]  # the members before it are still handed out
    assert "checksum" in error.message
    assert_located(error, offset)


def test_error_is_raised_again_by_later_calls():
    archive = bytearray(VECTORS["ustar_small"])
    offset = reference("ustar_small")[2][2]
    archive[offset] ^= 0x01
    reader = TarReader(URL)
    assert len(reader.feed(bytes(archive))) == 2  # members before the bad header
    with pytest.raises(FormatError) as first:
        reader.feed(b"more")
    with pytest.raises(FormatError) as second:
        reader.close()
    assert first.value is second.value and first.value.offset == offset


def test_checksum_off_by_the_adler_modulus_is_rejected():
    # The fast check works modulo 65521; a stored sum that is off by exactly that must still fail.
    for name in ("multidot", "signed_checksum"):  # an ASCII header and one with bytes >= 0x80
        archive = bytearray(VECTORS[name])
        header = bytes(archive[:148]) + b" " * 8 + bytes(archive[156:512])
        archive[148:156] = b"%06o\0 " % (sum(header) + 65521)
        _, error = feed_until_error(bytes(archive))
        assert "checksum" in error.message
        assert_located(error, 0)


@pytest.mark.parametrize(
    "garbage",
    [
        random.Random(1).randbytes(5000),
        b"\x89PNG\r\n\x1a\n" + random.Random(2).randbytes(3000),  # a PNG, not a tar
        b"<html><body>404 Not Found</body></html>\n" * 40,
        b"\x1f",  # looks like the start of gzip
        b"short",
    ],
)
def test_not_a_tar_file(garbage):
    members, error = feed_until_error(garbage)
    assert members == [] and error is not None
    assert_located(error, 0)


def test_gzip_required_or_refused():
    _, error = feed_until_error(VECTORS["multidot"], compressed=True)
    assert "gzip" in error.message and error.url == URL
    _, error = feed_until_error(VECTORS["ustar_small.gz"], compressed=False)
    assert "checksum" in error.message


def test_truncated_gzip():
    archive = VECTORS["ustar_small.gz"]
    for cut in (len(archive) - 1, len(archive) - 8, len(archive) // 2):
        members, error = feed_until_error(archive[:cut])
        assert members == reference("ustar_small")[: len(members)]
        assert "truncated gzip" in error.message and error.url == URL and error.offset is not None


def test_corrupt_gzip():
    archive = VECTORS["ustar_small.gz"]
    bad_method = archive[:2] + b"\x09" + archive[3:]  # compression method 9 does not exist
    members, error = feed_until_error(bad_method)
    assert members == [] and "corrupt gzip" in error.message and "at compressed byte 3" in error.message
    assert_located(error, 0)
    # Everything decompressed before the corruption is handed out, however the input is chunked.
    bad_crc = archive[:-8] + bytes([archive[-8] ^ 0xFF]) + archive[-7:]
    for chunk_size in (len(archive), 1000, 1):
        chunks = [bad_crc[i : i + chunk_size] for i in range(0, len(bad_crc), chunk_size)]
        members, error = feed_until_error(bad_crc, chunks)
        assert members == reference("ustar_small")
        assert "corrupt gzip" in error.message
        assert f"at compressed byte {len(archive) - 5}" in error.message  # the CRC's last byte
    corrupt = bytearray(archive)
    corrupt[len(archive) // 2] ^= 0x55
    results = [
        feed_until_error(bytes(corrupt), [corrupt[i : i + n] for i in range(0, len(corrupt), n)])
        for n in (len(corrupt), 4096, 333)
    ]
    for members, error in results:
        assert error is not None and error.url == URL and error.offset is not None
        assert (members, str(error)) == (results[0][0], str(results[0][1]))


def test_gzip_trailing_data():
    tar = VECTORS["multidot"]
    # After the archive has ended, whatever follows the gzip member is ignored (tarfile does too)...
    assert read([gzip.compress(tar) + b"trailing junk"]) == reference("multidot")
    # ...but before it, junk where the next gzip member should start is an error.
    cut = 2048
    _, error = feed_until_error(gzip.compress(tar[:cut]) + b"junk" + gzip.compress(tar[cut:]))
    assert "corrupt gzip" in error.message


def _one_member(info: tarfile.TarInfo, data: bytes = b"", format=tarfile.PAX_FORMAT) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=format) as tf:
        tf.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_a_malformed_sparse_member_is_an_error_naming_it():
    """A map whose region wants more bytes than the member stores, a PAX 1.0 map that is no
    number: a FormatError at the member (under its real name), not a member cut short."""
    archive = patch_header(_one_member(_info("sparse.bin", 4), b"data", tarfile.GNU_FORMAT), 0, 156, b"S")
    archive = patch_header(archive, 0, 398, b"00000000144\0")  # region 1: 100 bytes
    archive = patch_header(archive, 0, 483, b"00000000144\0")  # real size 100
    _, error = feed_until_error(archive)
    assert "invalid GNU sparse member" in error.message
    assert_located(error, 0, "sparse.bin")
    info = _info("pax-sparse.bin", 4)
    info.pax_headers = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.name": "real",
                        "GNU.sparse.realsize": "10"}
    _, error = feed_until_error(_one_member(info, b"data"))
    assert "invalid GNU sparse member" in error.message
    assert_located(error, 0, "real")


def _info(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    return info


def test_invalid_numbers():
    archive = _one_member(_info("file.txt", 4), b"data", tarfile.USTAR_FORMAT)
    for field in (b"0000000zzzz\0", b"\xff" + bytes(10) + b"\x01"):  # not octal; base-256 negative
        _, error = feed_until_error(patch_header(archive, 0, 124, field))
        assert "size" in error.message
        assert_located(error, 0, "file.txt")
    info = _info("file.txt", 4)
    info.pax_headers = {"size": "four"}
    _, error = feed_until_error(_one_member(info, b"data"))
    assert "PAX size" in error.message and error.member == "file.txt"


def test_extension_header_without_member():
    longname = tarfile.TarInfo._create_gnu_long_header("x" * 200, tarfile.GNUTYPE_LONGNAME, "utf-8", "strict")
    for tail, message in [(bytes(1024), "end-of-archive block right after"), (b"", "ends right after")]:
        _, error = feed_until_error(VECTORS["multidot"][:1024] + longname + tail)
        assert message in error.message
        assert_located(error, 1024)


# --- fuzz: only FormatError escapes, whatever the input and chunking --------------------------


def _fuzz_read(data: bytes, cuts):
    """Feed `data` split at `cuts`; return the members, or None after a FormatError."""
    reader = TarReader(URL)
    members = []
    try:
        for chunk in split(data, [c % (len(data) + 1) for c in cuts]):
            members += reader.feed(chunk)
        members += reader.close()
        reader.close()  # (an error kept back behind the last member: a cut in its padding)
    except FormatError as exc:
        assert exc.url == URL and exc.offset is not None
        return None
    for member in members:
        assert type(member.name) is str and type(member.data) is bytes and member.offset >= 0
    return [tuple(m) for m in members]


_mutation = st.tuples(
    st.sampled_from(["flip", "set", "insert", "delete", "zero", "cut"]),
    st.integers(0, 1 << 20),
    st.binary(min_size=1, max_size=16),
)


def _mutate(data: bytes, mutations) -> bytes:
    out = bytearray(data)
    for kind, where, blob in mutations:
        i = where % (len(out) + 1)
        if kind == "flip" and i < len(out):
            out[i] ^= blob[0] or 1
        elif kind == "set":
            out[i : i + len(blob)] = blob
        elif kind == "insert":
            out[i:i] = blob
        elif kind == "delete":
            del out[i : i + len(blob) * 37]
        elif kind == "zero":
            out[i : i + 512] = bytes(len(out[i : i + 512]))
        elif kind == "cut":
            del out[i:]
    return bytes(out)


@_FUZZ
@given(
    st.sampled_from([n for n in SMALL if n != "ustar_small"]),
    st.lists(_mutation, min_size=1, max_size=4),
    st.lists(st.integers(0, 1 << 20), max_size=6),
)
def test_fuzz_mutated_archives(name, mutations, cuts):
    archive = _mutate(VECTORS[name], mutations)
    members = _fuzz_read(archive, cuts)
    if members is not None and not name.endswith(".gz"):
        # Where both readers accept the mutant (tarfile is laxer), they must agree.
        try:
            expected = reference_members(archive)
        except Exception:
            return
        assert members == expected


@_FUZZ
@given(
    st.binary(max_size=4096),
    st.sampled_from(["raw", "gzip", "magic", "header"]),
    st.lists(st.integers(0, 1 << 13), max_size=4),
)
def test_fuzz_random_bytes(blob, wrap, cuts):
    if wrap == "gzip":
        blob = gzip.compress(blob)  # valid gzip: the garbage reaches the tar parser
    elif wrap == "magic":
        blob = b"\x1f\x8b" + blob
    elif wrap == "header":
        blob = VECTORS["multidot"][:512] + blob  # a valid header, then garbage data and headers
    _fuzz_read(blob, cuts)


# --- sans-IO: the reader imports nothing that does I/O ----------------------------------------

_ALLOWED = {"__future__", "bz2", "json", "lzma", "re", "struct", "typing", "zlib"}  # codecs, no I/O


def test_reader_modules_do_no_io():
    """Every module of the `_tar` folder, and the modules it imports, does no I/O (sans-IO)."""
    root = pathlib.Path(shardstream.__file__).parent
    todo = sorted(f"_tar/{p.name}" for p in (root / "_tar").glob("*.py"))
    seen = set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        folder = pathlib.PurePosixPath(module).parent
        for node in ast.walk(ast.parse((root / module).read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                assert node.level in (1, 2) and node.module, (module, ast.dump(node))
                base = folder if node.level == 1 else folder.parent
                todo.append(str(base / (node.module.replace(".", "/") + ".py")))  # ours: check them too
            elif isinstance(node, ast.ImportFrom):
                assert node.module.split(".")[0] in _ALLOWED, (module, node.module)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    assert alias.name.split(".")[0] in _ALLOWED, (module, alias.name)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in ("open", "__import__", "exec", "eval"), (module, node.func.id)
    assert seen == {"_tar/__init__.py", "_tar/reader.py", "_tar/codecs.py", "_tar/headers.py", "_tar/keys.py", "_tar/sparse.py",
                    "_base/errors.py", "_base/redact.py"}


# --- nothing after the end of the archive but padding or garbage -----------------------------


def _after_end(kind: str) -> bytes:
    first = VECTORS["ustar_small"]  # ends with two zero blocks (and record padding)
    second = tarvectors._tar([("late.txt", b"late")])
    if kind == "concatenated":
        return first + second
    if kind == "zero blocks mid-archive":
        head = tarvectors._tar([("a.txt", b"a")], format=tarfile.GNU_FORMAT)[:1024]  # header + payload block
        return head + bytes(1024) + second
    return first + bytes(20 * 512)  # record padding only


@pytest.mark.parametrize("kind", ["concatenated", "zero blocks mid-archive"])
@pytest.mark.parametrize("chunking", ["whole", "bytes", "4k"])
def test_a_header_after_the_end_of_archive_is_an_error(kind, chunking):
    data = _after_end(kind)
    step = {"whole": len(data), "bytes": 1, "4k": 4096}[chunking]
    members, error = feed_until_error(data, [data[i : i + step] for i in range(0, len(data), step)])
    assert error is not None and "after the end-of-archive" in error.message
    eoa = data.index(bytes(1024))
    assert eoa < error.offset <= eoa + 1024 + 10240 and error.offset % 512 == 0
    assert members == reference_members(data[:eoa] + bytes(1024))  # what came before is handed out


def test_padding_after_the_end_of_archive_is_fine():
    data = _after_end("padding")
    assert read([data]) == reference("ustar_small")


def test_a_local_shard_with_a_header_after_its_end_fails_to_load(tmp_path):
    import shardstream as wds

    path = tmp_path / "two.tar"
    path.write_bytes(_after_end("concatenated"))
    with pytest.raises(FormatError, match="after the end-of-archive"):
        list(wds.WebDataset(str(path), shardshuffle=False))


@pytest.mark.parametrize("codec", ["gzip", "bz2", "xz"])
def test_a_compressible_chunk_comes_out_a_step_at_a_time(codec):
    """One compressed chunk of 40 MiB of zeros (a few KB: a decompression bomb, or masks and
    padded arrays) was inflated whole in one call, and held with every member cut from it:
    memory grew with the shard. Each call now gives at most a step of tar (`backlog` says
    more waits), and the members are the same."""
    import bz2
    import lzma

    from shardstream._tar.codecs import OUT_STEP

    plain = tar_bytes(zero_members(40))
    compress = {"gzip": gzip.compress, "bz2": bz2.compress, "xz": lzma.compress}[codec]
    reader = TarReader("bomb.tar")
    batches = [reader.feed(compress(plain))]
    while reader.backlog:
        batches.append(reader.feed(b""))
    batches.append(reader.close())
    assert [m.name for batch in batches for m in batch] == [f"k{i:03d}.npy" for i in range(40)]
    assert all(m.data == bytes(1 << 20) for batch in batches for m in batch)
    assert max(sum(len(m.data) for m in batch) for batch in batches) <= OUT_STEP + (1 << 20)
    assert len(batches) >= 40 * (1 << 20) // (OUT_STEP + (1 << 20))
    closing = TarReader("bomb.tar")  # (a caller that does not ask for the rest: close hands it out)
    got = closing.feed(compress(plain))
    assert len(got) + len(closing.close()) == 40


def test_an_lzma_alone_shard_reads_as_tarfile_reads_it():
    """`.tar.lzma` (LZMA-alone, what `lzma` / `tar --lzma` write): tarfile, so webdataset, knows
    its magic; it was "bad tar header checksum (corrupt, or not a tar archive)"."""
    import lzma

    archive = VECTORS[NAMES[0]]
    packed = lzma.compress(archive, format=lzma.FORMAT_ALONE)
    assert packed[:4] == b"\x5d\x00\x00\x80"
    with tarfile.open(fileobj=io.BytesIO(packed), mode="r|*") as tar:
        expected = [(m.name, tar.extractfile(m).read()) for m in tar if m.isfile()]
    reader = TarReader("x.tar.lzma")
    got = [(m.name, m.data) for chunk in (packed[:3], packed[3:100], packed[100:]) for m in reader.feed(chunk)]
    got += [(m.name, m.data) for m in reader.close()]
    assert got == expected and got


def _sparse_archives(tmp_path) -> dict:
    """Archives GNU tar writes with `-S`: the old GNU format, and PAX sparse formats 0.0, 0.1, 1.0.
    `a.npy` has 3 data regions, `b.npy` 30 (the old format's map goes on in extension blocks)."""
    import subprocess

    src = tmp_path / "src"
    src.mkdir()
    rng = random.Random(5)
    for name, regions in (("a.npy", 3), ("b.npy", 30)):
        with open(src / name, "wb") as f:
            for i in range(regions):
                f.seek(i * 3 * 4096)
                f.write(rng.randbytes(4096 + i))
            f.truncate(regions * 3 * 4096 + 8192)
    (src / "a.cls").write_bytes(b"1")
    (src / "c.cls").write_bytes(b"2")
    archives = {}
    for label, options in (("gnu", ["--format=gnu"]), *((f"pax {v}", ["--format=posix", f"--sparse-version={v}"])
                                                        for v in ("0.0", "0.1", "1.0"))):
        path = tmp_path / f"{label.replace(' ', '_')}.tar"
        subprocess.run(["tar", "-S", *options, "-cf", str(path), "-C", str(src), "a.cls", "a.npy", "b.npy", "c.cls"],
                       check=True, capture_output=True)
        archives[label] = path.read_bytes()
    return archives


@pytest.mark.skipif(__import__("shutil").which("tar") is None, reason="needs GNU tar")
def test_gnu_sparse_members_read_as_tarfile_reads_them(tmp_path):
    """`tar -S` writes files with holes as sparse members; they were refused ("unsupported GNU
    sparse member"), losing the shard's rest, where webdataset (tarfile) reads them. Their real
    bytes now, holes as zeros, under their real names (PAX formats name a stand-in)."""
    for label, archive in _sparse_archives(tmp_path).items():
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            expected = [(m.name, tar.extractfile(m).read()) for m in tar if m.isfile()]
        assert [name for name, _ in expected] == ["a.cls", "a.npy", "b.npy", "c.cls"], label
        for chunk in (len(archive), 4096, 700):
            reader = TarReader(label)
            got = [(m.name, m.data) for at in range(0, len(archive), chunk) for m in reader.feed(archive[at : at + chunk])]
            got += [(m.name, m.data) for m in reader.close()]
            assert got == expected, (label, chunk)


@pytest.mark.skipif(__import__("shutil").which("tar") is None, reason="needs GNU tar")
def test_sparse_shards_read_through_the_loader_and_index(tmp_path):
    """Through WebDataset as webdataset reads them; `index` counts them and writes no .dali.idx
    (DALI reads what a member stores, not its holes)."""
    import webdataset

    import shardstream as wds
    from shardstream.cli import main

    for label, archive in _sparse_archives(tmp_path).items():
        path = tmp_path / "shard.tar"
        path.write_bytes(archive)
        ours = [(s["__key__"], s["npy"] if "npy" in s else s["cls"]) for s in wds.WebDataset(str(path), shardshuffle=False)]
        theirs = [(s["__key__"], s["npy"] if "npy" in s else s["cls"]) for s in webdataset.WebDataset(str(path), shardshuffle=False)]
        assert ours == theirs and len(ours) == 3, label
        assert main(["index", "-q", str(path)]) == 0
        assert not (tmp_path / "shard.tar.dali.idx").exists() and (tmp_path / "shard.tar.idx").exists()
        (tmp_path / "shard.tar.idx").unlink()


def test_a_large_member_in_chunks_is_joined_once_into_its_data():
    """A 6 MiB member fed in 64 KiB chunks (an HTTP body): its data is one join of exactly its
    bytes (a join of everything, then a slice of it, held a 1 GiB member three times over:
    +2.9 GB peak RSS over HTTP, now +2.1, as webdataset)."""
    payload = random.Random(3).randbytes((6 << 20) + 123)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        tar.addfile(_info("big.bin", len(payload)), io.BytesIO(payload))
        tar.addfile(_info("next.txt", 2), io.BytesIO(b"hi"))
    archive = out.getvalue()
    reader = TarReader("big.tar")
    got = [m for at in range(0, len(archive), 65536) for m in reader.feed(archive[at : at + 65536])]
    got += reader.close()
    assert [(m.name, m.data == payload if m.name == "big.bin" else m.data) for m in got] == [
        ("big.bin", True), ("next.txt", b"hi")]
    from shardstream._tar.reader import _Pieces

    pieces = _Pieces.around([b"abc", b"defg", b"hij"], 2, 8)
    assert pieces[2:8] is pieces._parts[1] and pieces[2:8] == b"cdefgh"
    assert [pieces[a:b] for a, b in ((0, 10), (1, 3), (7, 10), (0, 0))] == [b"abcdefghij", b"bc", b"hij", b""]


@pytest.mark.timeout(30)
def test_a_large_gzip_member_after_the_archive_is_ignored_not_spun_on():
    """`gzip(tar) + gzip(16 MiB of zeros)`: the trailing member's full step left 'more output'
    set while nothing more was wanted, and the reader spun for ever at 100% CPU."""
    from shardstream._shard.members import iter_members

    plain = io.BytesIO()
    with tarfile.open(fileobj=plain, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(3):
            tar.addfile(_info(f"s{i}.txt", 100), io.BytesIO(b"x" * 100))
    data = gzip.compress(plain.getvalue()) + gzip.compress(bytes(16 << 20))
    assert [m.name for m in iter_members([data], "x.tar.gz")] == ["s0.txt", "s1.txt", "s2.txt"]


def test_close_hands_out_what_waits_before_an_error_behind_it():
    """A caller of TarReader that feeds, then closes, without asking for the backlog: close hands
    it out; a truncated stream's error behind it comes with the next call, not in its place."""
    plain = io.BytesIO()
    with tarfile.open(fileobj=plain, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for i in range(4):
            tar.addfile(_info(f"s{i}.bin", 6 << 20), io.BytesIO(bytes(6 << 20)))
    cut = gzip.compress(plain.getvalue())[:-20]
    reader = TarReader("x.tar.gz")
    got = [m.name for at in range(0, len(cut), 1 << 20) for m in reader.feed(cut[at : at + (1 << 20)])]
    got += [m.name for m in reader.close()]
    assert got == ["s0.bin", "s1.bin", "s2.bin"]
    with pytest.raises(FormatError, match="truncated gzip"):
        reader.close()
