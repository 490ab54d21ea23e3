"""The webdataset 1.0.2 names the facades gained (test_webdataset_names.py checks that they
exist), each run through the public API and compared with webdataset's where its behaviour is
deterministic; where shardstream deliberately differs (README's divergence table), the test
says so.
"""

from __future__ import annotations

import gzip
import http.server
import io
import os
import random
import re
import stat
import subprocess
import sys
import tarfile
import threading
from itertools import islice

import numpy as np
import pytest
import webdataset
import webdataset.cache
import webdataset.compat
import webdataset.extradatasets
import webdataset.gopen
import webdataset.shardlists
import webdataset.tenbin
import webdataset.utils
import webdataset.writer
from compare import assert_same

import shardstream
import shardstream._fetch.open
import shardstream._fetch.openers
import shardstream.cache
import shardstream.compat
import shardstream.extradatasets
import shardstream.gopen
import shardstream.shardlists
import shardstream.tenbin
import shardstream.utils
import shardstream.writer
from needs import needs_torch

# `wds.gopen` is the function (the package attribute hides the module, in both libraries)
OURS_GOPEN, THEIRS_GOPEN = sys.modules["shardstream.gopen"], sys.modules["webdataset.gopen"]
BOTH = pytest.mark.parametrize("lib", ["webdataset", "shardstream"])


@pytest.fixture
def pipes_on(monkeypatch):
    """pipe: URLs enabled for one test (webdataset's default; ours is off)."""
    monkeypatch.setattr(shardstream._fetch.open, "_pipe_switch", True)


def lib_module(lib, name):
    return getattr(webdataset if lib == "webdataset" else shardstream, name)


def write_shard(path, prefix, n=3):
    with tarfile.open(path, "w") as tf:
        for i in range(n):
            for ext, data in (("txt", f"{prefix}{i}".encode()), ("cls", str(i).encode())):
                info = tarfile.TarInfo(f"{prefix}{i:03d}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))


# --- shardlists ----------------------------------------------------------------------------------


def shard_dir(tmp_path, lib, n=5):
    root = tmp_path / lib
    root.mkdir()
    for i in range(n):
        write_shard(root / f"shard{i}.tar", f"s{i}_")
        os.utime(root / f"shard{i}.tar", (1_000_000 + i, 1_000_000 + i))  # "oldest" order is 0..4
    return str(root) + "/"


def claimed_sequence(lib, path, **kw):
    """The shard names handed out (pid suffix removed) and what the directory holds after."""
    ds = lib_module(lib, "shardlists").DirectoryShardList(path, pattern="*.tar", poll=None, **kw)
    urls = [item["url"] for item in ds]
    return [os.path.basename(u).replace(f"._{os.getpid()}_", "._PID_") for u in urls], sorted(os.listdir(path))


@pytest.mark.parametrize("mode", ["unlink", "keep"])
def test_directory_shard_list_claims_and_recycles_like_webdataset(tmp_path, mode):
    expected = claimed_sequence("webdataset", shard_dir(tmp_path, "webdataset"), select="oldest", mode=mode)
    actual = claimed_sequence("shardstream", shard_dir(tmp_path, "shardstream"), select="oldest", mode=mode)
    assert actual == expected
    assert expected[0] == [f"shard{i}.tar._PID_" for i in range(5)]


def test_directory_shard_list_random_and_resample_like_webdataset(tmp_path):
    results = {}
    for lib in ("webdataset", "shardstream"):
        path = shard_dir(tmp_path, lib)
        random.seed(7)  # "random" uses the random module, as webdataset does
        ds = lib_module(lib, "shardlists").DirectoryShardList(path, pattern="*.tar", poll=None, mode="resample")
        picked = [os.path.basename(item["url"]) for item in islice(ds, 12)]
        results[lib] = picked, sorted(os.listdir(path))
    assert results["shardstream"] == results["webdataset"]


def test_directory_shard_list_feeds_a_pipeline_like_webdataset(tmp_path):
    """The shard reader asks for the next shard only after the current one is read, as
    webdataset's does, so a shard is not recycled (here: deleted) before it is opened."""
    results = {}
    for lib in ("webdataset", "shardstream"):
        wds = lib_module(lib, "shardlists")
        pipeline = lib_module(lib, "DataPipeline")(
            wds.DirectoryShardList(shard_dir(tmp_path, lib), pattern="*.tar", poll=None, mode="unlink", select="oldest"),
            lib_module(lib, "tarfile_to_samples")(),
        )
        results[lib] = [(s["__key__"], s["txt"]) for s in pipeline]
    assert results["shardstream"] == results["webdataset"] and len(results["webdataset"]) == 15
    assert os.listdir(tmp_path / "shardstream") == []


def test_directory_shard_list_recycles_claims_of_dead_processes(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for lib in ("webdataset", "shardstream"):
        path = shard_dir(tmp_path, lib, n=1)
        os.rename(path + "shard0.tar", path + f"shard0.tar._{dead.pid}_")
        lib_module(lib, "shardlists").DirectoryShardList(path, pattern="*.tar", poll=None).cleanup_files_without_processes()
        assert os.listdir(path) == ["shard0.tar"]  # mode "resample": back in the pool


def test_directory_shard_list_expands_braces_in_its_pattern(tmp_path):
    # Divergence (README): webdataset globs "*.{tar,tgz,tar.tgz}" literally, so its default
    # pattern matches nothing.
    for name in ("a.tar", "b.tgz", "c.txt"):
        (tmp_path / name).write_bytes(b"")
    ours = shardstream.shardlists.DirectoryShardList(str(tmp_path) + "/", poll=None, mode="keep", select="oldest")
    assert sorted(os.path.basename(item["url"]).split("._")[0] for item in ours) == ["a.tar", "b.tgz"]
    theirs = webdataset.shardlists.DirectoryShardList(str(tmp_path) + "/", poll=None)
    assert list(theirs) == []


def test_pid_and_name_helpers_like_webdataset():
    ours, theirs = shardstream.shardlists, webdataset.shardlists
    for name in ("a.tar._123_", "a.tar", "a._x_", "dir/b.tgz._7_", "._5_", "a.tar._done_"):
        assert ours.get_pid_from_filename(name) == theirs.get_pid_from_filename(name)
        assert ours.without_last_extension(name) == theirs.without_last_extension(name)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for pid in (os.getpid(), dead.pid):
        assert ours.check_pid_is_running(pid) == theirs.check_pid_is_running(pid)


def test_envlookup_expand_default_rng_obsolete(monkeypatch):
    ours, theirs = shardstream.shardlists, webdataset.shardlists
    monkeypatch.setenv("WDS_SPLIT", "train")
    match = re.search(r"\$\{(\w+)\}", "data/${SPLIT}.tar")
    assert ours.envlookup(match) == theirs.envlookup(match) == "train"
    monkeypatch.setenv("SHARDDIR", "/data")
    for text in ("~/x/$SHARDDIR/a.tar", "${SHARDDIR}/b", "plain"):
        assert ours.expand(text) == theirs.expand(text)
    assert isinstance(ours.default_rng, random.Random) and isinstance(theirs.default_rng, random.Random)
    assert ours.obsolete is shardstream.utils.obsolete and shardstream.cache.obsolete is shardstream.utils.obsolete
    monkeypatch.delenv("ALLOW_OBSOLETE", raising=False)
    for obsolete in (ours.obsolete, theirs.obsolete):
        with pytest.raises(Exception, match="obsolete"):
            obsolete(lambda: 1)()


# --- gopen ---------------------------------------------------------------------------------------


@BOTH
def test_pipe_reads_writes_and_checks_the_exit_status(tmp_path, lib):
    gopen = sys.modules[f"{lib}.gopen"]
    with gopen.Pipe("printf abc", mode="rb", shell=True) as pipe:
        assert pipe.read() == b"abc"
    target = tmp_path / "out"
    with gopen.Pipe(f"cat > {target}", mode="wb", shell=True) as pipe:
        pipe.write(b"written")
    assert target.read_bytes() == b"written"
    pipe = gopen.Pipe("printf x; exit 3", mode="rb", shell=True)
    with pytest.raises(OSError, match="exit 3"):
        while pipe.read(1):
            pass
        pipe.close()
    quiet = gopen.Pipe("exit 3", mode="rb", shell=True, ignore_status=[3])
    quiet.read()
    quiet.close()
    assert gopen.set_options(quiet, timeout=5, ignore_errors=True) is True and quiet.timeout == 5
    assert gopen.set_options(io.BytesIO(), timeout=5) is False
    assert gopen.info == {}
    if lib == "shardstream":  # webdataset's makes a Pipe without a process
        with pytest.raises(ValueError, match="unknown mode"):
            gopen.Pipe("true", mode="x", shell=True)


def test_gopen_file_pipe_and_error_like_webdataset(tmp_path, monkeypatch):
    ours, theirs = OURS_GOPEN, THEIRS_GOPEN
    path = tmp_path / "f.bin"
    with ours.gopen_file(str(path), "wb") as f:
        f.write(b"\x00data")
    for url in (str(path), f"file://{path}"):
        with ours.gopen_file(url) as a, theirs.gopen_file(url) as b:
            assert a.read() == b.read() == b"\x00data"
        with ours.gopen(url) as a, theirs.gopen(url) as b:  # buffered both: peek works
            assert type(a) is type(b) and a.peek(1)[:1] == b.peek(1)[:1] == b"\x00" and a.read() == b.read()
    monkeypatch.setattr(shardstream._fetch.open, "_pipe_switch", False)
    with pytest.raises(ValueError, match="off by default"):  # divergence: pipes are opt-in
        ours.gopen_pipe(f"pipe:cat {path}")
    monkeypatch.setattr(shardstream._fetch.open, "_pipe_switch", True)
    with ours.gopen_pipe(f"pipe:cat {path}") as a, theirs.gopen_pipe(f"pipe:cat {path}") as b:
        assert a.read() == b.read()
    with ours.gopen_pipe(f"pipe:cat > {tmp_path}/g.bin", "wb") as out:
        out.write(b"piped")
    assert (tmp_path / "g.bin").read_bytes() == b"piped"
    for module in (ours, theirs):
        with pytest.raises(ValueError, match=r"^x://y: no gopen handler defined$"):
            module.gopen_error("x://y")


class _Uploads(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # answers curl's "Expect: 100-continue" at once
    store: dict = {}

    def end_headers(self):
        # one request per connection: no handler thread outlives the test on a pooled connection
        self.send_header("Connection", "close")
        self.close_connection = True
        super().end_headers()

    def do_GET(self):  # noqa: N802
        body = self.store.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_PUT(self):  # noqa: N802
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":  # curl -T - streams
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                body += self.rfile.read(size)
                self.rfile.readline()
                if size == 0:
                    break
        else:
            body = self.rfile.read(int(self.headers["Content-Length"]))
        self.store[self.path] = body
        self.send_response(201)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def upload_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Uploads)
    server.daemon_threads = False  # server_close() joins the handler threads
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Uploads.store = {"/data.bin": bytes(range(256)) * 100}
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.skipif(not os.path.exists("/usr/bin/curl") and not any(
    os.path.exists(os.path.join(p, "curl")) for p in os.environ.get("PATH", "").split(os.pathsep)),
    reason="curl is not installed")
def test_gopen_curl_reads_and_uploads_like_webdataset(upload_server):
    ours, theirs = OURS_GOPEN, THEIRS_GOPEN
    with ours.gopen_curl(f"{upload_server}/data.bin") as a, theirs.gopen_curl(f"{upload_server}/data.bin") as b:
        assert a.read() == b.read() == bytes(range(256)) * 100
    for module, name in ((ours, "ours"), (theirs, "theirs")):
        with module.gopen_curl(f"{upload_server}/{name}.bin", "wb") as out:
            out.write(b"uploaded by " + name.encode())
    assert _Uploads.store["/ours.bin"] == b"uploaded by ours" and _Uploads.store["/theirs.bin"] == b"uploaded by theirs"
    for module in (ours, theirs):
        with pytest.raises(ValueError, match="unknown mode"):
            module.gopen_curl(f"{upload_server}/data.bin", "ab")


@pytest.fixture
def fake_tools(tmp_path, monkeypatch):
    """`gsutil` and `ais` stand-ins on PATH: they log their arguments and print or store data."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    for tool in ("gsutil", "ais"):
        script = bin_dir / tool
        script.write_text(
            "#!/bin/sh\n"
            f'echo "{tool} $*" >> {log}\n'
            'case "$1" in cat|get) printf "payload of %s" "$2";; cp|put) cat > "' + str(tmp_path) + '/upload";; esac\n'
        )
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return log, tmp_path / "upload"


def test_gopen_gsutil_and_ais_run_the_same_commands_as_webdataset(fake_tools):
    log, upload = fake_tools
    calls = {}
    for lib in ("webdataset", "shardstream"):
        module = sys.modules[f"{lib}.gopen"]
        log.write_text("")
        read = []
        for opener, url in ((module.gopen_gsutil, "gs://b/x.tar"), (module.gopen_ais, "ais://b/y.tar")):
            with opener(url) as stream:
                read.append(stream.read())
            with opener(url, "wb") as stream:
                stream.write(b"up " + url.encode())
            read.append(upload.read_bytes())
        calls[lib] = read, log.read_text()
    assert calls["shardstream"] == calls["webdataset"]
    assert calls["webdataset"][1].splitlines() == ["gsutil cat gs://b/x.tar", "gsutil cp - gs://b/x.tar", "ais get ais://b/y.tar -", "ais put - ais://b/y.tar"]


def test_gopen_htgs_and_hf(monkeypatch):
    seen = []
    monkeypatch.setattr(shardstream._fetch.openers, "open_http", lambda url, bufsize=8192: seen.append(url) or io.BytesIO(b""))
    OURS_GOPEN.gopen_htgs("htgs://bucket/dir/x.tar")
    assert seen == ["https://storage.googleapis.com/bucket/dir/x.tar"]  # webdataset hands gs:// to curl
    for module in (OURS_GOPEN, THEIRS_GOPEN):
        with pytest.raises(ValueError, match="cannot write"):
            module.gopen_htgs("htgs://bucket/x.tar", "wb")
    with pytest.raises(ValueError, match="cannot write"):
        OURS_GOPEN.gopen_hf("hf://datasets/a/b/x.tar", "wb")
    try:
        import huggingface_hub  # noqa: F401
    except ImportError:
        for module in (OURS_GOPEN, THEIRS_GOPEN):
            with pytest.raises(ImportError):
                module.gopen_hf("hf://datasets/a/b/x.tar")


def test_use_ais_for_routes_schemes_to_gopen_ais():
    code = "import sys, {m}.gopen; g = sys.modules['{m}.gopen']; print(g.gopen_schemes.get('gs') is g.gopen_ais, g.gopen_schemes.get('s3') is g.gopen_ais)"
    env = dict(os.environ, USE_AIS_FOR="gs:s3")
    for lib in ("webdataset", "shardstream"):
        out = subprocess.run([sys.executable, "-c", code.format(m=lib)], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.split() == ["True", "True"]


def _message(exn_info):
    return re.sub(r" \(url=.*\)$", "", str(exn_info.value))  # ours also says where


@needs_torch
def test_enforce_security_refuses_what_webdataset_refuses(tmp_path, monkeypatch, pipes_on):
    import pickle

    path = tmp_path / "f.txt"
    path.write_bytes(b"x")
    monkeypatch.setenv("GOPEN_REWRITE", "http://a/=http://b/")
    previous = shardstream.allow_pickle(True)
    messages = {}
    try:
        for lib in ("webdataset", "shardstream"):
            utils, gopen = sys.modules[f"{lib}.utils"], sys.modules[f"{lib}.gopen"]
            autodecode = sys.modules[f"{lib}.autodecode"]
            utils.enforce_security = True
            try:
                found = []
                for call in (lambda: gopen.gopen(str(path)), lambda: gopen.gopen(f"file://{path}"),
                             lambda: gopen.gopen_pipe("pipe:true"), lambda: gopen.rewrite_url("http://a/x"),
                             lambda: autodecode.unpickle_loads(pickle.dumps(1)),
                             lambda: autodecode.torch_loads(b"")):
                    with pytest.raises(ValueError) as caught:
                        call()
                    found.append(_message(caught))
                messages[lib] = found
            finally:
                utils.enforce_security = False
    finally:
        shardstream.allow_pickle(previous)
    assert messages["shardstream"] == messages["webdataset"]
    assert shardstream.utils.enforce_security is False
    with OURS_GOPEN.gopen(str(path)) as f:
        assert f.read() == b"x"


def test_enforce_security_reaches_the_loader(tmp_path, pipes_on):
    write_shard(tmp_path / "a.tar", "k")
    assert len(list(shardstream.WebDataset(f"pipe:cat {tmp_path}/a.tar", shardshuffle=False))) == 3
    shardstream.utils.enforce_security = True
    try:
        with pytest.raises(ValueError, match="cannot open pipe URLs"):
            list(shardstream.WebDataset(f"pipe:cat {tmp_path}/a.tar", shardshuffle=False))
    finally:
        shardstream.utils.enforce_security = False


# --- writer, compat, cache, extradatasets ------------------------------------------------------------


def test_writer_reexports_and_writes_to_pipes_when_enabled(tmp_path, monkeypatch):
    assert shardstream.writer.gopen is OURS_GOPEN.gopen
    sample = {"__key__": "a", "txt": "hello", "cls": 3}
    with webdataset.writer.TarWriter(f"pipe:cat > {tmp_path}/theirs.tar") as sink:
        sink.write(dict(sample))
    monkeypatch.setattr(shardstream._fetch.open, "_pipe_switch", True)
    with shardstream.writer.TarWriter(f"pipe:cat > {tmp_path}/ours.tar") as sink:
        sink.write(dict(sample))
    read = [list(webdataset.WebDataset(str(tmp_path / name), shardshuffle=False).decode())
            for name in ("theirs.tar", "ours.tar")]
    for a, b in zip(*read):
        a.pop("__url__"), b.pop("__url__"), a.pop("__local_path__", None), b.pop("__local_path__", None)
    assert_same(read[1], read[0])


def test_compat_reexports():
    from shardstream import filters, tariterators

    assert shardstream.compat.group_by_keys is tariterators.group_by_keys
    assert shardstream.compat.tar_file_expander is tariterators.tar_file_expander
    assert shardstream.compat.pipelinefilter is filters.pipelinefilter


def test_cache_filetypes_like_webdataset(tmp_path):
    write_shard(tmp_path / "a.tar", "k")
    (tmp_path / "a.tgz").write_bytes(gzip.compress((tmp_path / "a.tar").read_bytes()))
    (tmp_path / "a.bin").write_bytes(b"not a tar")
    (tmp_path / "empty").write_bytes(b"")
    for name in ("a.tar", "a.tgz", "a.bin", "empty"):
        path = str(tmp_path / name)
        assert shardstream.cache.magic_filetype(path) == webdataset.cache.magic_filetype(path)
        try:
            expected = webdataset.cache.get_filetype(path)
        except AssertionError:
            pytest.skip("the file command is not installed")
        assert shardstream.cache.get_filetype(path) == expected
    assert shardstream.cache.verbose_cache == webdataset.cache.verbose_cache
    for module in (shardstream.cache, webdataset.cache):
        with pytest.raises(AssertionError):
            module.url_to_cache_name(123)


@needs_torch
def test_extradatasets_repeatedly_runs():
    # webdataset's class cannot even be made (no __iter__, and it never stores nepochs: README
    # divergence); ours
    # repeats like webdataset's utils.repeatedly.
    repeated = shardstream.extradatasets.repeatedly(range(3), nepochs=2, length=6)
    assert list(repeated) == list(webdataset.utils.repeatedly(range(3), nepochs=2)) and len(repeated) == 6
    stage = shardstream.extradatasets.repeatedly(None, nbatches=5)
    assert list(stage.run([0, 1, 2])) == [0, 1, 2, 0, 1]
    # a one-shot source: a pass that yields nothing ends it (webdataset's utils.repeatedly spins)
    assert list(shardstream.DataPipeline(lambda: iter(range(3)), stage)) == [0, 1, 2]
    with pytest.raises(TypeError):  # abstract: it has no __iter__
        webdataset.extradatasets.repeatedly(range(3), nepochs=2)


# --- tenbin --------------------------------------------------------------------------------------

ARRAYS = [np.arange(12, dtype=np.float32).reshape(3, 4), np.zeros((0, 2), dtype=np.int64), np.ones(5, dtype=np.uint8)]


def test_tenbin_helpers_like_webdataset():
    ours, theirs = shardstream.tenbin, webdataset.tenbin
    for s in ("", "f4", "~TenBin~", "abc"):
        assert ours.str64(s) == theirs.str64(s) and ours.unstr64(ours.str64(s)) == theirs.unstr64(theirs.str64(s))
    assert (ours.magic_str, ours.magic, ours.magic_bytes) == (theirs.magic_str, theirs.magic, theirs.magic_bytes)
    assert [ours.roundup(n) for n in (0, 1, 64, 65)] == [theirs.roundup(n) for n in (0, 1, 64, 65)]
    assert ours.roundup(5, 8) == theirs.roundup(5, 8)
    # the one difference: webdataset's table spells uint32 "unit32" (README divergence)
    assert {k: v for k, v in ours.long_to_short.items() if k != "uint32"} == {
        k: v for k, v in theirs.long_to_short.items() if k != "unit32"}
    assert ours.short_to_long["u4"] == "uint32" and theirs.short_to_long["u4"] == "unit32"
    for value in (b"abc", bytearray(b"xy"), ARRAYS[0]):
        assert ours.bytelen(value) == theirs.bytelen(value)
        assert bytes(ours.bytedata(value)) == bytes(theirs.bytedata(value))
    with pytest.raises(ValueError):
        ours.bytelen(3)


def test_tenbin_headers_lists_and_chunks_like_webdataset():
    ours, theirs = shardstream.tenbin, webdataset.tenbin
    for a in ARRAYS:
        header = bytes(ours.encode_header(a, "info"))
        assert header == bytes(theirs.encode_header(a, "info"))
        shape, dtype, info = ours.decode_header(header)
        assert (shape, dtype, info) == tuple(theirs.decode_header(header))
    chunks = ours.encode_list(ARRAYS, infos=["a", "b", "c"])
    assert [bytes(c) for c in chunks] == [bytes(c) for c in theirs.encode_list(ARRAYS, infos=["a", "b", "c"])]
    buffer = ours.encode_chunks(chunks)
    assert bytes(buffer) == bytes(theirs.encode_chunks(theirs.encode_list(ARRAYS, infos=["a", "b", "c"])))
    assert [bytes(c) for c in ours.decode_chunks(bytes(buffer))] == [bytes(c) for c in theirs.decode_chunks(bytes(buffer))]
    assert_same(ours.decode_list(ours.decode_chunks(bytes(buffer))), theirs.decode_list(theirs.decode_chunks(bytes(buffer))))
    arrays, infos = ours.decode_list(chunks, infos=True)
    assert infos == theirs.decode_list(chunks, infos=True)[1] == ["a", "b", "c"]
    with pytest.raises(ValueError):
        ours.encode_list(ARRAYS, infos=["a"])


def test_tenbin_streams_and_files_like_webdataset(tmp_path):
    ours, theirs = shardstream.tenbin, webdataset.tenbin
    a, b = io.BytesIO(), io.BytesIO()
    ours.write(a, ARRAYS, infos=["x", "y", "z"])
    theirs.write(b, ARRAYS, infos=["x", "y", "z"])
    assert a.getvalue() == b.getvalue()
    for reader in (ours.read, theirs.read):
        assert_same(reader(io.BytesIO(a.getvalue())), ARRAYS)
        assert_same(reader(io.BytesIO(a.getvalue()), n=1), ARRAYS[:1])
    chunk = io.BytesIO()
    ours.write_chunk(chunk, b"12345")
    assert chunk.getvalue() == (lambda s: theirs.write_chunk(s, b"12345") or s.getvalue())(io.BytesIO())
    chunk.seek(0)
    assert ours.read_chunk(chunk) == b"12345" and ours.read_chunk(chunk) is None
    ours.save(str(tmp_path / "ours.ten"), *ARRAYS)
    theirs.save(str(tmp_path / "theirs.ten"), *ARRAYS)
    assert (tmp_path / "ours.ten").read_bytes() == (tmp_path / "theirs.ten").read_bytes()
    assert_same(ours.load(str(tmp_path / "theirs.ten")), theirs.load(str(tmp_path / "ours.ten")))
    for module in (ours, theirs):
        with pytest.raises(ValueError, match=r"\.ten"):
            module.save(str(tmp_path / "x.bin"), *ARRAYS)
    with pytest.raises(ValueError, match="premature EOF"):  # webdataset returns the short chunk
        ours.read_chunk(io.BytesIO(a.getvalue()[:20]))


def test_tenbin_checks():
    ours, theirs = shardstream.tenbin, webdataset.tenbin
    data = [np.zeros(2)]
    for required in (None, False, True):
        assert_same(ours.check_infos(data, ["a"], required), theirs.check_infos(data, ["a"], required))
    for module in (ours, theirs):
        with pytest.raises(ValueError):
            module.check_infos(data, ["a"], "a")
        with pytest.raises(ValueError):
            module.check_acceptable_input_type([np.array(["s"])], True)
    # Divergences (README): webdataset's list check raises even when the infos match, and its
    # 64-bit check refuses every type but the 64-bit ones.
    assert ours.check_infos(data, ["a"], ["a"]) is data
    with pytest.raises(ValueError, match="doesn't match"):
        ours.check_infos(data, ["a"], ["b"])
    ours.check_acceptable_input_type([np.zeros(2, np.float32)], False)
    ours.check_acceptable_input_type([np.zeros(2)], True)
    with pytest.raises(ValueError, match="64 bit"):
        ours.check_acceptable_input_type([np.zeros(2)], False)


def test_an_opener_in_gopen_schemes_reads_its_schemes_shards_everywhere_as_in_webdataset(tmp_path, monkeypatch):
    """webdataset's way to plug in storage (`gopen_schemes["s3"] = my_open`) reaches the loader,
    and the 0.2.x generators, not only `gopen`; the dict has webdataset's keys."""
    from shardsets import sample_members, write_tar

    for n in range(2):
        write_tar(str(tmp_path / f"x-{n}.tar"), [m for i in range(3 * n, 3 * n + 3) for m in sample_members(i, exts=("cls",))])
    assert set(shardstream.gopen_schemes) == set(webdataset.gopen_schemes)
    for scheme in ("local", "http", "__default__"):  # a new scheme, one we fetch natively, every other one
        urls = [f"{'other' if scheme == '__default__' else scheme}://nowhere.invalid/x-{n}.tar" for n in range(2)]
        results = {}
        for lib in (webdataset, shardstream):
            calls = []

            def open_local(url, mode="rb", bufsize=8192, **kw):
                calls.append(url)
                return open(tmp_path / url.rsplit("/", 1)[1], mode)

            monkeypatch.setitem(lib.gopen_schemes, scheme, open_local)
            results[lib.__name__] = (
                [s["__key__"] for s in lib.WebDataset(urls, shardshuffle=False)],
                [s["__key__"] for s in lib.DataPipeline(lib.SimpleShardList(urls), lib.tarfile_to_samples())],
                [s["fname"] for s in lib.tariterators.tar_file_expander(lib.tariterators.url_opener([{"url": u} for u in urls]))
                 if s],  # (webdataset's end-of-shard markers aside)
                len(calls),
            )
        assert results["shardstream"] == results["webdataset"], scheme
        assert results["shardstream"][0] == [f"s{i:04d}" for i in range(6)] and results["shardstream"][3] == 6
        urls[1] = urls[1].replace("x-1", "missing")
        with pytest.raises(shardstream.ShardNotFound) as info:
            list(shardstream.WebDataset(urls, shardshuffle=False))
        assert info.value.url == urls[1]
        monkeypatch.undo()


def test_enforce_security_refuses_a_pickle_field_as_a_decoding_error(tmp_path):
    """Under webdataset's switch a pickle field fails to decode as in webdataset: a DecodingError
    caused by a ValueError (code that catches DecodingError keeps working)."""
    import pickle

    path = tmp_path / "p.tar"
    with webdataset.TarWriter(str(path)) as sink:
        sink.write({"__key__": "s0", "pyd": pickle.dumps({"a": 1}), "txt": "x"})
    previous = shardstream.allow_pickle(True)
    caught = {}
    try:
        for lib in (webdataset, shardstream):
            lib.utils.enforce_security = True
            try:
                with pytest.raises(lib.autodecode.DecodingError) as info:
                    list(lib.WebDataset(str(path), shardshuffle=False).decode())
                caught[lib.__name__] = type(info.value.__cause__)
            finally:
                lib.utils.enforce_security = False
    finally:
        shardstream.allow_pickle(previous)
    assert caught["shardstream"] is caught["webdataset"] is ValueError


def test_a_shard_spec_reads_only_wds_variables(monkeypatch):
    """`${NAME}` is WDS_NAME, as in webdataset: a spec copied from a dataset card must not send
    the user's secrets to its server (`.../${AWS_SECRET_ACCESS_KEY}.tar` went out as the key)."""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "hunter2secret")
    monkeypatch.delenv("WDS_AWS_SECRET_ACCESS_KEY", raising=False)
    spec = "http://127.0.0.1:9/x/${AWS_SECRET_ACCESS_KEY}.tar"
    with pytest.raises(shardstream.UsageError, match="WDS_AWS_SECRET_ACCESS_KEY is not set") as info:
        shardstream.shardlists.expand_urls(spec)
    assert "hunter2secret" not in str(info.value)
    with pytest.raises(shardstream.UsageError):
        list(shardstream.WebDataset(spec, shardshuffle=False))
    monkeypatch.setenv("WDS_AWS_SECRET_ACCESS_KEY", "named")
    assert shardstream.shardlists.expand_urls(spec) == webdataset.shardlists.expand_urls(spec) == [
        "http://127.0.0.1:9/x/named.tar"]
