"""The `shardstream` command: inspect, verify, index, extract (safely), prepare."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time

import pytest
import webdataset
from children import interruptible
from shardsets import sample_members, write_tar

from shardstream._shard.index import read_index
from shardstream.cli import main


def test_verify_reports_counts_and_failures(shardset, tmp_path, capsys):
    assert main(["verify", "::".join(shardset)]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["shards"] == len(shardset) and report["failed"] == 0
    bad = tmp_path / "bad.tar"
    bad.write_bytes(open(shardset[0], "rb").read()[:3000])
    assert main(["verify", str(bad)]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and str(bad) in out and "offset=" in out


def test_a_garbage_index_beside_a_shard_is_a_failure_naming_it(shardset, tmp_path, capsys, monkeypatch):
    """An `.idx` that is not one (hand-edited, another tool's) fails `verify` and the equal-work
    split with the file and line, not a bare ValueError from int()."""
    import shardstream as wds

    shard = shutil.copy(shardset[0], tmp_path)
    with open(shard + ".idx", "w") as f:
        f.write("0 s0000\nnot an index\n")
    assert main(["verify", shard]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "bad index line 2" in out and shard + ".idx" in out
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(wds.FormatError, match="bad index line 2") as caught:
        list(wds.WebDataset(shard, shardshuffle=False, nodesplitter=wds.split_by_node))
    assert caught.value.url == shard + ".idx"


def test_commands_read_globs_and_folders_as_the_loader_does(shardset, tmp_path, capsys):
    """A spec names the same shards for the command as for WebDataset: a glob, a folder with its
    trailing slash, and one without it."""
    folder = os.path.dirname(shardset[0])
    expected = len(shardset)
    for spec in (os.path.join(folder, "shard-00*.tar*"), folder + "/", folder):
        assert main(["verify", spec]) == 0, spec
        report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert report["shards"] == expected and report["failed"] == 0, spec
    assert main(["ls", os.path.join(folder, "shard-00[0-1].tar")]) == 0
    assert set(re.findall(r"shard-00\d", capsys.readouterr().out)) == {"shard-000", "shard-001"}


def test_index_writes_offsets_and_sizes(shardset, tmp_path, capsys):
    # a copy: index files beside the shared shard set would change what other tests read
    shardset = [shutil.copy(path, tmp_path) for path in shardset]
    assert main(["index", "::".join(shardset)]) == 0
    sizes = json.load(open(os.path.join(os.path.dirname(shardset[0]), "sizes.json")))
    for path in shardset:
        n = len(list(webdataset.WebDataset(path, shardshuffle=False)))
        assert sizes[os.path.basename(path)] == n
        index = read_index(path + ".idx")
        assert len(index) == n
    # offsets point at the sample's first member header (cross-checked with tarfile)
    first = read_index(shardset[0] + ".idx")
    members = {m.name: m.offset for m in tarfile.open(shardset[0]) if m.isreg()}
    for offset, key in first:
        assert offset == min(o for name, o in members.items() if name.startswith(key + "."))


def test_names_with_hash_and_question_marks_are_names_outside_http(tmp_path, capsys):
    """Only an http(s) URL has a query and a fragment: `a#1.tar` and `a#2.tar` (a file, or an S3
    key) are two shards, not both `a` (sizes.json and the .idx files were one, overwritten)."""
    paths = []
    for n, count in ((1, 2), (2, 5)):
        path = str(tmp_path / f"a#{n}?.tar")
        write_tar(path, [m for i in range(count) for m in sample_members(10 * n + i, exts=("cls",))])
        paths.append(path)
    assert main(["index", "::".join(paths), "-q"]) == 0
    assert json.load(open(tmp_path / "sizes.json")) == {"a#1?.tar": 2, "a#2?.tar": 5}
    assert all(os.path.exists(path + ".idx") for path in paths)
    from shardstream._plan.urls import shard_name

    assert shard_name("https://h/d/a.tar?X-Amz-Signature=1#f") == "a.tar"
    assert shard_name("s3://b/d/a#1.tar") == "a#1.tar"


def test_inspect_prints_samples(shardset, capsys):
    assert main(["inspect", shardset[0], "-n", "2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and json.loads(lines[0])["__key__"] == "s0000"


def test_extract_refuses_paths_outside_the_target(tmp_path, capsys):
    evil = str(tmp_path / "evil.tar")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in ("ok/a.txt", "../escape.txt"):
            info = tarfile.TarInfo(name)
            info.size = 2
            tar.addfile(info, io.BytesIO(b"hi"))
    open(evil, "wb").write(buf.getvalue())
    dest = tmp_path / "out"
    assert main(["extract", evil, str(dest)]) == 1
    assert not (tmp_path / "escape.txt").exists()
    err = capsys.readouterr().err
    assert "outside the target directory" in err and "evil.tar" in err and "offset=1024" in err  # (where, too)
    good = write_tar(str(tmp_path / "good.tar"), sample_members(1))
    assert main(["extract", good, str(dest)]) == 0
    assert (dest / "s0001.cls").read_bytes() == b"1"


def test_extract_refuses_a_member_that_would_overwrite_an_earlier_one(tmp_path, capsys):
    """Two members of one name: the loader and verify refuse the shard; extract said "extracted 2
    members" and kept the second one's bytes."""
    dup = write_tar(str(tmp_path / "dup.tar"), [("a.txt", b"first"), ("a.txt", b"second")])
    dest = tmp_path / "out"
    assert main(["extract", dup, str(dest)]) == 1
    err = capsys.readouterr().err
    assert "duplicate file name" in err and "member='a.txt'" in err and "offset=1024" in err
    assert (dest / "a.txt").read_bytes() == b"first"


def test_prepare_packs_a_directory_webdataset_can_read(tmp_path, capsys):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    for i in range(7):
        (src / "sub" / f"item{i}.txt").write_text(f"text {i}")
        (src / "sub" / f"item{i}.cls").write_text(str(i))
    pattern = str(tmp_path / "shards" / "part-%03d.tar")
    assert main(["prepare", str(src), pattern, "--maxcount", "3"]) == 0
    shards = sorted(n for n in os.listdir(tmp_path / "shards") if n.endswith(".tar"))
    assert shards == ["part-000.tar", "part-001.tar", "part-002.tar"]  # with their indexes and sizes.json
    samples = list(webdataset.WebDataset([str(tmp_path / "shards" / s) for s in shards], shardshuffle=False))
    assert [s["__key__"] for s in samples] == [f"sub/item{i}" for i in range(7)]
    assert samples[3]["txt"] == b"text 3" and samples[3]["cls"] == b"3"


@pytest.mark.parametrize("command", [["verify"], ["stats"], ["index", "--sizes", "SIZES"]])
def test_ctrl_c_ends_a_command_at_once_while_its_server_stalls(command, tmp_path):
    """A server that takes the request and never answers: Ctrl-C ends the command with 130 at
    once, not after the stall timeout and its retries (minutes)."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted = []
    threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/shard-000.tar"
    argv = [arg.replace("SIZES", str(tmp_path / "sizes.json")) for arg in command]
    proc = subprocess.Popen([sys.executable, "-m", "shardstream", *argv, url], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=interruptible)
    try:
        deadline = time.monotonic() + 30
        while not accepted and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert accepted, proc.poll()
        time.sleep(0.3)  # (the request is in; the command waits for an answer)
        proc.send_signal(signal.SIGINT)
        start = time.monotonic()
        _out, err = proc.communicate(timeout=20)
        assert proc.returncode == 130 and "interrupted" in err
        assert time.monotonic() - start < 5
    finally:
        proc.kill()
        proc.communicate()
        listener.close()
        for conn, _ in accepted:
            conn.close()


@pytest.mark.parametrize("content, why", [("{not json", "is not JSON"), ("[1, 2]", "is not an object")])
def test_index_says_so_when_the_sizes_file_it_would_merge_into_is_broken(shardset, tmp_path, capsys, content, why):
    shard = shutil.copy(shardset[0], tmp_path)
    (tmp_path / "sizes.json").write_text(content)
    assert main(["index", shard]) == 1
    err = capsys.readouterr().err
    assert why in err and "sizes.json" in err and "Traceback" not in err


def test_bench_refuses_an_unknown_decode_spec_and_honours_limit_zero(shardset, capsys):
    assert main(["bench", shardset[0], "--decode", "bogus"]) == 2  # a command-line mistake
    assert "--decode 'bogus'" in capsys.readouterr().err
    assert main(["bench", shardset[0], "--limit", "0", "--json", "-q"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["samples"] == 0
    first = len(list(webdataset.WebDataset(shardset[0], shardshuffle=False)))
    assert main(["bench", "::".join(shardset[:3]), "--limit", str(first), "-q"]) == 0
    assert f"{first} samples from 1 of 3 shards" in capsys.readouterr().out  # (it said "from 3 shards")


def test_option_mistakes_exit_2(shardset, tmp_path, capsys):
    """The exit code --help states for a command-line mistake, 2, whether argparse or a later check
    finds it (a failure of the work stays 1: the verify and extract tests above)."""
    shard, dest = shardset[0], str(tmp_path / "out")
    for argv in (["verify", shard, "--threads", "0"], ["ls", shard, "-n", "-1"], ["bench", shard, "--limit", "-3"],
                 ["create", shard, dest, "--maxcount", "0"], ["create", shard, dest, "--workers", "two"],
                 ["inspect", shard, "-n", "-2"], ["create", shard, dest, "--rank", "-1"]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2, argv
        err = capsys.readouterr().err
        assert "must be at least" in err or "not an integer" in err, err
    for argv, why in ((["create", shard, dest, "--quality", "101"], "--quality"),
                      (["create", shard, dest, "--pattern", "same.tar"], "%-number"),
                      (["create", shard, dest, "--rank", "2", "--world-size", "2"], "--rank"),
                      (["create", shard, dest, "--ray-address", "auto"], "--engine ray")):
        assert main(argv) == 2, argv
        assert why in capsys.readouterr().err
    assert not os.path.exists(dest) or os.listdir(dest) == []


def test_extract_says_which_links_it_leaves_out(tmp_path, capsys):
    """A shard's links and special files are not extracted (no link is ever made or followed), and
    the command names each one, where it used to pass over them without a word."""
    shard = tmp_path / "links.tar"
    with tarfile.open(shard, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, kind, target in (("s0.txt", tarfile.REGTYPE, ""), ("s0.cls", tarfile.SYMTYPE, "/etc/passwd"),
                                   ("s1.txt", tarfile.LNKTYPE, "s0.txt"), ("fifo", tarfile.FIFOTYPE, "")):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, target
            info.size = 2 if kind == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(b"hi") if kind == tarfile.REGTYPE else None)
    with tarfile.open(shard) as tar:
        offsets = {m.name: m.offset for m in tar.getmembers()}
    dest = tmp_path / "out"
    assert main(["extract", str(shard), str(dest)]) == 0
    captured = capsys.readouterr()
    assert sorted(os.listdir(dest)) == ["s0.txt"]
    assert "left out 3 links or special files" in captured.out
    for name, kind in (("s0.cls", "symbolic link"), ("s1.txt", "hard link"), ("fifo", "FIFO")):
        assert f"left out {name!r}: a {kind} (offset {offsets[name]})" in captured.err


@pytest.mark.parametrize("odd", ["\r", "\n"])
def test_index_of_keys_with_line_breaks_reads_back(tmp_path, odd, capsys):
    """A key with a `\\r` made an `.idx` its reader refused (universal newlines: "bad index line
    2"), and the advice to run `index` again looped; a key with a `\\n` cannot be a line: that
    shard gets no `.idx` (and loses an earlier one), and says so."""
    path = str(tmp_path / "odd.tar")
    write_tar(path, [(f"a{odd}b.jpg", b"x"), ("c.jpg", b"y"), ("d.jpg", b"z")])
    with open(path + ".idx", "w") as f:
        f.write("0 old\n")
    assert main(["index", path]) == 0
    if odd == "\r":
        assert [key for _, key in read_index(path + ".idx")] == [f"a{odd}b", "c", "d"]
    else:
        assert not os.path.exists(path + ".idx") and "no .idx: a key holds a newline" in capsys.readouterr().out
    assert main(["verify", "-q", "--no-decode", path]) == 0


def test_index_writes_nothing_outside_out_for_a_url_whose_name_is_a_path(tmp_path, capsys):
    """A shard's name is its URL's last segment, percent-decoded: `.%2F..%2F..%2Fx.tar` is
    `./../../x.tar`. `index --out DIR` joined it to DIR and wrote (and, for keys with line
    breaks, deleted) `x.tar.idx` two folders above DIR."""
    from aiohttp import web
    from looptools import serve_app

    from shardstream._fetch.loop import run_coroutine

    from shardsets import tar_bytes

    body = tar_bytes([("s0.txt", b"a"), ("s1.txt", b"b")])

    async def handle(request):
        return web.Response(body=body)

    runner, url = serve_app(handle)
    out = tmp_path / "a" / "b"
    victim = tmp_path / "victim.tar.idx"
    victim.write_bytes(b"someone else's index")
    try:
        base = url.rsplit("/", 1)[0]
        assert main(["index", f"{base}/x/.%2F..%2F..%2Fvictim.tar", "--out", str(out), "-q"]) == 1
    finally:
        run_coroutine(runner.cleanup()).result(5)
    err = capsys.readouterr().err
    assert "not a plain file name" in err and "victim.tar" in err
    assert victim.read_bytes() == b"someone else's index"
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["victim.tar.idx"]
