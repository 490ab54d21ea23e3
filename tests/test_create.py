"""`shardstream create` and the commands around it, driven as a user drives them (subprocesses):
folder -> create -> verify -> index -> read by webdataset 1.0.2 and shardstream; byte-identical
output whatever the workers; manifests with URLs from the test HTTP server; resharding; hand
partitioning; S3 as DEST; nothing written outside DEST."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import shutil
import subprocess
import sys
import tarfile
import time

import numpy as np
import pytest
import webdataset
from PIL import Image

import shardstream as wds
from children import interruptible
from motoserver import moto_endpoint, s3_admin, s3_env  # noqa: F401 - fixtures
from shardstream._prep._indexes import read_dali_index

pytestmark = pytest.mark.timeout(180)

CLASSES = {"cat": 9, "dog": 8, "eel": 6}
SAMPLES = sum(CLASSES.values()) + 2  # + dog/alpha.png, eel/Big.Fish.JPEG
TOKEN = "Zq9createtok"


def cli(*args, cwd=None, timeout=120):
    """Run `python -m shardstream ARGS` as a user would; (exit status, stdout, stderr)."""
    done = subprocess.run([sys.executable, "-m", "shardstream", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)
    return done.returncode, done.stdout, done.stderr


def tree(root) -> dict:
    """{relative path: bytes} of every file under root."""
    found = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            found[os.path.relpath(path, root)] = open(path, "rb").read()
    return found


def shards_of(dest) -> list:
    return sorted(os.path.join(dest, n) for n in os.listdir(dest) if n.endswith(".tar"))


def samples_of(urls) -> dict:
    return {s["__key__"]: {k: v for k, v in s.items() if not k.startswith("__")}
            for s in wds.WebDataset(urls, shardshuffle=False)}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """An ImageFolder: 3 class folders of JPEGs of assorted sizes, a PNG with alpha, an upper-case
    .JPEG with dots in its name, a caption file beside one image, a hidden file."""
    src = tmp_path_factory.mktemp("imagefolder") / "images"
    rng = np.random.default_rng(0)
    for name, count in CLASSES.items():
        (src / name).mkdir(parents=True)
        for i in range(count):
            pixels = rng.integers(0, 255, (30 + 9 * i, 40 + 11 * i, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(src / name / f"img{i}.jpg", quality=85)
    Image.new("RGBA", (50, 20), (255, 0, 0, 128)).save(src / "dog" / "alpha.png")
    (src / "eel" / "Big.Fish.JPEG").write_bytes((src / "eel" / "img5.jpg").read_bytes())
    (src / "cat" / "img0.txt").write_text("the first cat")
    (src / ".hidden").write_text("not a sample")
    return src


@pytest.fixture(scope="module")
def files(folder):
    return str(folder), None  # what the conftest `server` fixture serves


@pytest.fixture(scope="module")
def created(folder, tmp_path_factory):
    dest = tmp_path_factory.mktemp("created") / "shards"
    code, out, err = cli("create", folder, dest, "--maxcount", 7, "--seed", 3, "--workers", 2, "--threads", 2)
    assert code == 0, err
    assert "shardstream create" not in err  # no progress bar without a terminal
    return dest


def test_round_trip_folder_create_verify_index_and_both_readers(folder, created, tmp_path):
    names = sorted(os.listdir(created))
    assert [n for n in names if n.endswith(".tar")] == [f"shard-{i:06d}.tar" for i in range(4)]
    assert json.loads((created / "classes.json").read_text()) == {"cat": 0, "dog": 1, "eel": 2}
    sizes = json.loads((created / "sizes.json").read_text())
    assert sizes == {f"shard-{i:06d}.tar": n for i, n in enumerate([7, 7, 7, SAMPLES - 21])}

    code, out, err = cli("verify", created, "--require", "jpg;png,cls", "-v")
    assert code == 0, out + err
    report = json.loads(out.strip().splitlines()[-1])
    assert report == {**report, "shards": 4, "samples": SAMPLES, "images": SAMPLES, "failed": 0}

    # index rebuilds exactly what create wrote (indexes and sizes.json), here into --out
    code, out, err = cli("index", created, "--out", tmp_path / "idx")
    assert code == 0, err
    for name, data in tree(tmp_path / "idx").items():
        assert data == (created / name).read_bytes(), name

    urls = shards_of(created)
    ours = list(wds.WebDataset(urls, shardshuffle=False))
    theirs = list(webdataset.WebDataset(urls, shardshuffle=False))
    assert [s["__key__"] for s in ours] == [s["__key__"] for s in theirs]
    for a, b in zip(ours, theirs):
        a.pop("__local_path__", None)
        b.pop("__local_path__", None)
        assert a == b
    by_key = {s["__key__"]: s for s in ours}
    assert len(by_key) == SAMPLES and sorted(by_key) != [s["__key__"] for s in ours]  # shuffled
    assert by_key["cat/img3"]["jpg"] == (folder / "cat" / "img3.jpg").read_bytes()
    assert by_key["cat/img3"]["cls"] == b"0" and by_key["eel/img1"]["cls"] == b"2"
    assert by_key["cat/img0"]["txt"] == b"the first cat"
    assert by_key["dog/alpha"]["png"] == (folder / "dog" / "alpha.png").read_bytes()
    assert by_key["eel/Big_Fish"]["jpg"] == (folder / "eel" / "Big.Fish.JPEG").read_bytes()
    with tarfile.open(urls[0]) as tar:
        member = tar.getmembers()[0]
        header = (member.mtime, member.uname, member.gname, member.mode, member.uid)
        assert header == (0, "bigdata", "bigdata", 0o444, 0)


def test_same_bytes_whatever_the_workers_threads_and_seed(folder, created, tmp_path):
    code, _, err = cli("create", folder, tmp_path / "one", "--maxcount", 7, "--seed", 3, "--workers", 1, "--threads", 1)
    assert code == 0, err
    assert tree(tmp_path / "one") == tree(created)
    code, _, err = cli("create", folder, tmp_path / "unshuffled", "--maxcount", 7)
    assert code == 0, err
    keys = list(samples_of(shards_of(tmp_path / "unshuffled")))
    assert keys == sorted(keys)


def test_dali_index_offsets_are_tarfile_payload_offsets(created, tmp_path):
    shard = shards_of(created)[0]
    with tarfile.open(shard) as tar:
        expected = [(m.name, m.offset_data, m.size) for m in tar.getmembers()]
    dali = read_dali_index((created / (os.path.basename(shard) + ".dali.idx")).read_text())
    assert [(name, offset, size) for sample in dali for _, offset, size, name in sample] == expected
    assert all(len({n.split(".")[0] for _, _, _, n in sample}) == 1 for sample in dali)

    # PAX and GNU long names push the payload further than one header block
    long_key = "deep/" * 30 + "naïve-sample"
    for fmt, name in ((tarfile.PAX_FORMAT, "pax.tar"), (tarfile.GNU_FORMAT, "gnu.tar")):
        with tarfile.open(tmp_path / name, "w", format=fmt) as tar:
            for key in ("s0", long_key, "s2"):
                for ext, data in (("cls", b"1"), ("txt", b"x" * 700)):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    code, out, err = cli("index", f"{tmp_path / 'pax.tar'}::{tmp_path / 'gnu.tar'}")
    assert code == 0, err
    for name in ("pax.tar", "gnu.tar"):
        with tarfile.open(tmp_path / name) as tar:
            members = tar.getmembers()
        dali = read_dali_index((tmp_path / f"{name}.dali.idx").read_text())
        found = [(n, o, s) for sample in dali for _, o, s, n in sample]
        assert found == [(m.name, m.offset_data, m.size) for m in members]
        assert [ext for sample in dali for ext, _, _, _ in sample] == ["cls", "txt"] * 3
        ours = [line.split(" ", 1) for line in (tmp_path / f"{name}.idx").read_text().splitlines()]
        assert [(int(o), k) for o, k in ours] == [(m.offset, m.name.rsplit(".", 1)[0]) for m in members[::2]]


def _image(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.new("RGB", (8, 8), (10, 20, 30)).save(path)


def test_class_folders_keep_their_names_and_linked_ones_count(tmp_path):
    """classes.json names the folders as on disk (a dot or a space is kept; only keys change),
    `a.b/` and `a_b/` stay two classes, a linked class folder is walked (a link back up is not),
    and two files that would share a key are refused instead of merged."""
    src, real = tmp_path / "src", tmp_path / "real"
    for path in ("a.b/x.jpg", "a_b/y.jpg", "my bird/z.jpg"):
        _image(str(src / path))
    _image(str(real / "dog" / "d.jpg"))
    os.symlink(real / "dog", src / "dog")
    os.symlink(real, real / "dog" / "loop")  # a loop: dog/loop/dog/loop/...
    os.symlink(real / "dog", src / "felines")  # a second name for the same folder: a class of its own
    rc, _out, err = cli("create", src, tmp_path / "out", "-q")
    assert rc == 0, err
    classes = json.load(open(tmp_path / "out" / "classes.json"))
    assert classes == {"a.b": 0, "a_b": 1, "dog": 2, "felines": 3, "my bird": 4}
    labels = {key: int(v["cls"]) for key, v in samples_of(shards_of(tmp_path / "out")).items()}
    assert labels == {"a_b/x": 0, "a_b/y": 1, "dog/d": 2, "felines/d": 3, "my_bird/z": 4}
    rc, _out, err = cli("create", src, tmp_path / "out2", "-q", "--classes", tmp_path / "out" / "classes.json")
    assert rc == 0, err
    _image(str(src / "a_b" / "x.jpg"))  # a.b/x and a_b/x: both would be key a_b/x
    rc, _out, err = cli("create", src, tmp_path / "out3", "-q")
    assert rc == 1 and "both become sample key 'a_b/x'" in err


def test_reencoding_bounds_the_longer_side(folder, tmp_path):
    code, _, err = cli("create", folder, tmp_path / "small", "--max-side", 48, "--maxcount", 100, "--workers", 1)
    assert code == 0, err
    samples = samples_of(shards_of(tmp_path / "small"))
    for key, fields in samples.items():
        image = fields.get("jpg") or fields["png"]
        size = Image.open(io.BytesIO(image)).size
        assert max(size) <= 48, (key, size)
    assert samples["cat/img0"]["jpg"] == (folder / "cat" / "img0.jpg").read_bytes()  # 40x30: kept as it is
    assert samples["cat/img8"]["jpg"] != (folder / "cat" / "img8.jpg").read_bytes()
    code, _, err = cli("create", folder, tmp_path / "q", "--quality", 60, "--max-side", 32, "--maxcount", 100)
    assert code == 0, err
    samples = samples_of(shards_of(tmp_path / "q"))
    assert "png" not in samples["dog/alpha"] and Image.open(io.BytesIO(samples["dog/alpha"]["jpg"])).mode == "RGB"
    assert all(max(Image.open(io.BytesIO(f["jpg"])).size) <= 32 for f in samples.values())


def test_reencoding_scales_16_bit_grey_images_instead_of_clipping_them(tmp_path):
    """A 16-bit PNG re-encoded to JPEG keeps its tones (Pillow's convert clips at 255: nearly white)."""
    values = (np.arange(64 * 64, dtype=np.uint32).reshape(64, 64) * 15).astype(np.uint16)  # 0..61425
    os.makedirs(tmp_path / "src" / "depth")
    Image.fromarray(values).save(tmp_path / "src" / "depth" / "d.png")
    assert Image.open(tmp_path / "src" / "depth" / "d.png").mode in ("I;16", "I")
    code, _, err = cli("create", tmp_path / "src", tmp_path / "out", "--quality", 95, "--workers", 1)
    assert code == 0, err
    jpeg = samples_of(shards_of(tmp_path / "out"))["depth/d"]["jpg"]
    got = np.asarray(Image.open(io.BytesIO(jpeg)).convert("L"), dtype=np.float64)
    assert abs(got.mean() - values.mean() / 257) < 3


def _manifest(path, rows, header=("url", "caption", "label", "source")):
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def test_manifest_of_urls_from_the_http_server(server, folder, tmp_path):
    server.options.require_token = TOKEN
    try:
        rows = [[server.url(f"cat/img{i}.jpg", token=TOKEN), f"cat number {i}", 0, "web"] for i in range(5)]
        rows.insert(2, [server.url("cat/missing.jpg", token=TOKEN), "gone", 0, "web"])
        manifest = _manifest(tmp_path / "urls.csv", rows)
        code, out, err = cli("create", manifest, tmp_path / "strict", "--maxcount", 4, "--workers", 1)
        assert code == 1 and "missing.jpg" in err and "--skip-errors" in err
        assert TOKEN not in out + err
        assert not [n for n in os.listdir(tmp_path / "strict") if n.startswith(".")]  # no temp files left
        code, out, err = cli("create", manifest, tmp_path / "web", "--maxcount", 4, "--skip-errors", "--workers", 2)
        assert code == 0, err
        assert "left out: sample '000000002'" in out and TOKEN not in out + err
    finally:
        server.options.require_token = None
    for data in tree(tmp_path / "web").values():
        assert TOKEN.encode() not in data
    samples = samples_of(shards_of(tmp_path / "web"))
    assert list(samples) == ["000000000", "000000001", "000000003", "000000004", "000000005"]
    first = samples["000000003"]
    assert first["jpg"] == (folder / "cat" / "img2.jpg").read_bytes()
    assert first["txt"] == b"cat number 2" and first["cls"] == b"0"
    meta = json.loads(first["json"])
    assert meta["source"] == "web" and meta["key"] == "000000003" and meta["url"].endswith("img2.jpg?token=***")
    assert json.loads((tmp_path / "web" / "sizes.json").read_text()) == {"shard-000000.tar": 3, "shard-000001.tar": 2}


def test_ctrl_c_stops_a_run_with_workers_at_once_and_leaves_no_temp_files(server, folder, tmp_path):
    """Ctrl-C reaches the whole process group: the workers leave it to the parent, which stops
    the shards being written (their temp files removed) and exits 130, instead of workers that
    caught the interrupt themselves (a traceback from an idle one; at times a hang)."""
    server.options.latency_ms = 300  # a slow origin: shard 0 (4 rows) takes 1.2 s, shard 1 (1 row) 0.3 s
    try:
        rows = [[server.url(f"cat/img{i}.jpg"), f"cat {i}", 0, "web"] for i in range(5)]
        manifest = _manifest(tmp_path / "urls.csv", rows)
        proc = subprocess.Popen([sys.executable, "-m", "shardstream", "create", str(manifest), str(tmp_path / "out"),
                                 "--maxcount", "4", "--workers", "2", "--threads", "1", "-q"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True,
                                preexec_fn=interruptible)
        try:
            deadline = time.monotonic() + 60
            out = tmp_path / "out"
            while time.monotonic() < deadline and not (out.exists() and any(n[0] == "." for n in os.listdir(out))):
                time.sleep(0.05)  # until a worker writes a shard
            time.sleep(0.6)  # shard 1's worker is idle now, shard 0's still fetching
            os.killpg(proc.pid, signal.SIGINT)
            start = time.monotonic()
            _out, err = proc.communicate(timeout=30)
            assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in err, err
            assert time.monotonic() - start < 10
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
        assert [n for n in os.listdir(tmp_path / "out") if n.startswith(".") and "tmp" in n] == []
    finally:
        server.options.latency_ms = 0


def test_a_sigterm_ends_a_workers_shard_then_the_worker_and_a_second_one_waits_for_that(tmp_path):
    """A pool worker's SIGTERM unwinds the shard being written (its cleanup runs), then ends the
    worker: the pool's worker loop would otherwise catch the SystemExit and take its next task.
    ProcessPoolExecutor sends every live worker one more SIGTERM when another exits: it must not
    cut the cleanup short (it did, inside a tar stream's finaliser, once in a full run of the
    Ctrl-C test above, which printed a traceback)."""
    marker = tmp_path / "cleaned"
    code = f"""
import os, signal, time
from shardstream._prep import _engines
def write_shard(task, ctx):
    try:
        os.kill(os.getpid(), signal.SIGTERM)  # the parent stops the shard being written
        time.sleep(10)
    finally:
        os.kill(os.getpid(), signal.SIGTERM)  # the executor's second one, during the cleanup
        time.sleep(0.1)
        open({str(marker)!r}, "w").close()
_engines.write_shard = write_shard
_engines._worker_signals()
try:
    _engines._write_in_worker(None, None)
except BaseException as exn:
    print("caught", repr(exn))  # (what the pool's worker loop does)
print("next task")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM and marker.exists(), (proc.stdout, proc.stderr)
    assert proc.stdout == "" and "Traceback" not in proc.stderr, (proc.stdout, proc.stderr)


def test_csv_jsonl_and_parquet_manifests_give_the_same_shards(folder, tmp_path):
    records = [{"path": f"images/{c}/img{i}.jpg", "caption": f"{c} {i}", "label": n, "extra": f"e{i}"}
               for n, c in enumerate(CLASSES) for i in range(3)]
    os.symlink(folder, tmp_path / "images")  # manifest paths are relative to the manifest
    _manifest(tmp_path / "m.csv", [list(r.values()) for r in records], header=list(records[0]))
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    # pandas writes an int column with gaps as floats: "1.0" is label 1, as in the JSONL
    _manifest(tmp_path / "m-floats.csv", [[*list(r.values())[:2], f"{r['label']}.0", r["extra"]] for r in records],
              header=list(records[0]))
    inputs = ["m.csv", "m.jsonl", "m-floats.csv"]
    try:
        import pyarrow
        import pyarrow.parquet

        pyarrow.parquet.write_table(pyarrow.Table.from_pylist(records), tmp_path / "m.parquet")
        inputs.append("m.parquet")
    except ImportError:
        pass
    for name in inputs:
        code, _, err = cli("create", tmp_path / name, tmp_path / f"out-{name}", "--maxcount", 4, "--seed", 1)
        assert code == 0, (name, err)
    results = [tree(tmp_path / f"out-{name}") for name in inputs]
    assert all(result == results[0] for result in results[1:])
    samples = samples_of(shards_of(tmp_path / "out-m.csv"))
    assert len(samples) == 9 and {s["cls"] for s in samples.values()} == {b"0", b"1", b"2"}


def test_a_manifest_named_like_a_glob_is_a_manifest(folder, tmp_path):
    """`captions[v2].csv` is a manifest: its name is not taken for a glob of shards."""
    os.symlink(folder, tmp_path / "images")
    manifest = _manifest(tmp_path / "captions[v2].csv", [["images/cat/img0.jpg", "a", 0, "k0"]],
                         header=("path", "caption", "label", "key"))
    code, _, err = cli("create", manifest, tmp_path / "out", "--workers", 1)
    assert code == 0, err
    assert list(samples_of(shards_of(tmp_path / "out"))) == ["k0"]


def test_manifest_keys_stay_inside_the_shard(folder, tmp_path):
    """A key column's "/abs" or "dir/" would make an absolute or empty member name (extract refuses
    the first, index skips the second): keys are made relative, and ".." is refused."""
    os.symlink(folder, tmp_path / "images")
    rows = [["images/cat/img0.jpg", "a", 0, "/abs"], ["images/cat/img1.jpg", "b", 0, "dir/"],
            ["images/cat/img2.jpg", "c", 0, "x//y"]]
    _manifest(tmp_path / "m.csv", rows, header=("path", "caption", "label", "key"))
    code, _, err = cli("create", tmp_path / "m.csv", tmp_path / "out", "--workers", 1)
    assert code == 0, err
    with tarfile.open(tmp_path / "out" / "shard-000000.tar") as tar:
        assert {m.name.split(".")[0] for m in tar.getmembers()} == {"abs", "dir", "x/y"}
    code, _, err = cli("extract", tmp_path / "out" / "shard-000000.tar", tmp_path / "x")
    assert code == 0, err
    header = ("path", "caption", "label", "key")
    _manifest(tmp_path / "bad.csv", [["images/cat/img0.jpg", "a", 0, "a/../b"]], header=header)
    code, _, err = cli("create", tmp_path / "bad.csv", tmp_path / "bad", "--workers", 1)
    assert code == 1 and "names no file inside a shard" in err


def test_reshard_keeps_every_sample(created, tmp_path):
    source = samples_of(shards_of(created))
    code, _, err = cli("create", created, tmp_path / "re", "--maxcount", 10, "--seed", 5, "--workers", 2)
    assert code == 0, err
    resharded = samples_of(shards_of(tmp_path / "re"))
    assert resharded == source and list(resharded) != list(source)
    assert json.loads((tmp_path / "re" / "sizes.json").read_text()) == {
        "shard-000000.tar": 10, "shard-000001.tar": 10, "shard-000002.tar": SAMPLES - 20}
    code, _, err = cli("create", created, tmp_path / "same", "--maxcount", 100, "--pattern", "all-%02d.tar.gz",
                       "--rekey")
    assert code == 0, err
    rekeyed = list(wds.WebDataset(str(tmp_path / "same" / "all-00.tar.gz"), shardshuffle=False))
    assert [s["__key__"] for s in rekeyed] == [f"{i:09d}" for i in range(SAMPLES)]
    assert [s["jpg" if "jpg" in s else "png"] for s in rekeyed] == [f.get("jpg", f.get("png")) for f in source.values()]
    biggest = max(len(b"".join(f.values())) for f in source.values())
    code, _, err = cli("create", created, tmp_path / "sized", "--maxsize", 30000, "--rekey")
    assert code == 0, err
    for shard in shards_of(tmp_path / "sized"):
        payload = sum(len(v) for s in samples_of(shard).values() for v in s.values())
        assert payload < 30000 + biggest


def test_reshard_reads_a_glob_of_shards_as_the_loader_does(created, tmp_path):
    """`create` names its source shards as the loader and the other commands do: a glob too
    (it was taken for one shard named "shard-*.tar": "shard not found")."""
    code, _, err = cli("create", str(created / "shard-00000[0-1].tar"), tmp_path / "re", "--maxcount", 100)
    assert code == 0, err
    expected = samples_of(shards_of(created)[:2])
    assert samples_of(shards_of(tmp_path / "re")) == expected and len(expected) == 14


def test_reshard_refuses_a_stale_count_instead_of_dropping_samples(created, tmp_path):
    """The reshard plans from the source's sizes.json: a count one short left the shard's last
    sample out without a word, and one too long wrote a sample fewer than planned."""
    source = tmp_path / "source"
    shutil.copytree(created, source)
    sizes = json.loads((source / "sizes.json").read_text())
    name = sorted(sizes)[1]
    for wrong, why in ((sizes[name] - 1, "more than the"), (sizes[name] + 1, "ends after")):
        (source / "sizes.json").write_text(json.dumps({**sizes, name: wrong}))
        for seed in ((), ("--seed", 2)):
            code, _, err = cli("create", source, tmp_path / f"re-{wrong}-{len(seed)}", "--maxcount", 5, *seed)
            assert code == 1 and why in err and name in err, err
    (source / "sizes.json").write_text(json.dumps(sizes))
    code, _, err = cli("create", source, tmp_path / "re", "--maxcount", 5, "--seed", 2)
    assert code == 0, err


def test_hand_partitioning_writes_what_one_run_writes(folder, created, tmp_path):
    for rank in (1, 0):
        code, _, err = cli("create", folder, tmp_path / "parts", "--maxcount", 7, "--seed", 3, "--rank", rank,
                           "--world-size", 2, "--workers", 1)
        assert code == 0, err
    assert tree(tmp_path / "parts") == tree(created)


def test_nothing_is_written_outside_dest(folder, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    code, _, err = cli("create", folder, "out", "--maxcount", 50, "--workers", 1, cwd=work)
    assert code == 0, err
    assert os.listdir(work) == ["out"] and not [n for n in os.listdir(work / "out") if n.startswith(".")]
    code, _, err = cli("create", folder, "out", cwd=work)
    assert code == 1 and "--overwrite" in err
    code, _, err = cli("create", folder, "out", "--overwrite", "--workers", 1, cwd=work)
    assert code == 0, err
    for pattern in ("../escape-%d.tar", ".hidden-%d.tar", "sub/x-%d.tar", "same.tar", "x-%d.zip"):
        code, _, err = cli("create", folder, "other", "--pattern", pattern, cwd=work)
        assert code == 2 and err.startswith("error: --pattern"), (pattern, err)
    assert sorted(os.listdir(work)) == ["out"] and not (tmp_path / "escape-0.tar").exists()


def test_overwrite_leaves_only_this_runs_shards(folder, created, tmp_path):
    """--overwrite after a run with more shards: DEST holds this run's dataset, not a mix (the old
    shards and their indexes go; a shard rewritten without a DALI index loses the old one); files
    that are not shards of the pattern stay."""
    dest = tmp_path / "out"
    code, _, err = cli("create", folder, dest, "--maxcount", 5, "--workers", 1)
    assert code == 0, err
    (dest / "notes.txt").write_text("mine")
    code, _, err = cli("create", folder, dest, "--maxcount", 100, "--overwrite", "--no-dali", "--workers", 1)
    assert code == 0, err
    assert sorted(os.listdir(dest)) == ["classes.json", "notes.txt", "shard-000000.tar", "shard-000000.tar.idx",
                                        "sizes.json"]
    assert len(list(wds.WebDataset(str(dest) + "/", shardshuffle=False))) == SAMPLES


def test_a_failed_overwrite_leaves_no_shard_of_the_earlier_dataset(folder, tmp_path):
    """--overwrite whose run fails part way: DEST held the earlier dataset's later shards beside
    the new first one, and the earlier sizes.json, which still counted them; now it holds what
    this run wrote and no sizes.json (nothing there counts shards it does not hold)."""
    dest = tmp_path / "out"
    code, _, err = cli("create", folder, dest, "--maxcount", 5, "--workers", 1)
    assert code == 0, err
    before = sorted(n for n in os.listdir(dest) if n.endswith(".tar"))
    image = str(next(p for p in (folder / "cat").iterdir() if p.suffix == ".jpg"))
    manifest = _manifest(tmp_path / "m.csv", [[image], [image], [str(tmp_path / "missing.jpg")], [image]], header=["url"])
    code, _, err = cli("create", manifest, dest, "--maxcount", 2, "--workers", 1, "--overwrite")
    assert code == 1 and "missing.jpg" in err
    left = sorted(os.listdir(dest))
    assert "sizes.json" not in left and "classes.json" not in left
    assert [n for n in left if n.endswith(".tar")] == ["shard-000000.tar"] and len(before) > 1
    assert len(list(wds.WebDataset(str(dest / "shard-000000.tar"), shardshuffle=False))) == 2


def test_s3_as_dest(folder, created, s3_env, s3_admin, tmp_path):
    s3_admin.create_bucket(Bucket="made")
    code, out, err = cli("create", folder, "s3://made/train", "--maxcount", 7, "--seed", 3, "--workers", 2)
    assert code == 0, err
    for name, data in tree(created).items():
        assert s3_admin.get_object(Bucket="made", Key=f"train/{name}")["Body"].read() == data, name
    samples = list(wds.WebDataset("s3://made/train/shard-{000000..000003}.tar", shardshuffle=False))
    assert len(samples) == SAMPLES
    manifest = _manifest(tmp_path / "bad.csv", [["images/cat/img1.jpg", "", 0, ""], ["missing.jpg", "", 0, ""]])
    os.symlink(folder, tmp_path / "images")
    code, _, err = cli("create", manifest, "s3://made/failed", "--workers", 1)
    assert code == 1 and "missing.jpg" in err
    assert s3_admin.list_objects_v2(Bucket="made", Prefix="failed/").get("KeyCount", 0) == 0  # discarded, not committed
    code, out, err = cli("create", folder, "s3://made/train", "--maxcount", 100, "--overwrite", "--workers", 1)
    assert code == 0, err  # one shard now: the four of the first run and their indexes are gone
    keys = [o["Key"] for o in s3_admin.list_objects_v2(Bucket="made", Prefix="train/")["Contents"]]
    assert sorted(keys) == ["train/classes.json", "train/shard-000000.tar", "train/shard-000000.tar.dali.idx",
                            "train/shard-000000.tar.idx", "train/sizes.json"]
    code, out, err = cli("create", folder, "s3://mdae/train", "--workers", 1)  # (a typo: no such bucket)
    assert code == 1 and "no bucket 'mdae'" in err, err
    assert "mdae" not in [b["Name"] for b in s3_admin.list_buckets()["Buckets"]]  # (s3fs's makedirs made it)


def test_index_of_remote_shards_into_out(created, tmp_path):
    from shardserver import ShardServer

    with ShardServer(str(created)) as served:
        served.options.require_token = TOKEN
        spec = served.url("shard-{000000..000003}.tar", token=TOKEN).replace("%7B", "{").replace("%7D", "}")
        code, out, err = cli("index", spec, cwd=tmp_path)
        assert code == 2 and "--out" in err and not os.listdir(tmp_path)  # a command-line mistake
        code, out, err = cli("index", spec, "--out", tmp_path / "idx", cwd=tmp_path)
    assert code == 0, err
    assert TOKEN not in out + err and "token=***" in out
    written = tree(tmp_path / "idx")
    assert sorted(written) == sorted(n for n in tree(created) if n.endswith(".idx") or n == "sizes.json")
    for name, data in written.items():
        assert data == (created / name).read_bytes(), name


def test_verify_names_shard_member_and_offset(tmp_path):
    good = io.BytesIO()
    Image.new("RGB", (8, 8)).save(good, "JPEG")
    entries = [("s0.jpg", good.getvalue()), ("s0.txt", b"ok"), ("s1.jpg", good.getvalue()[:60]), ("s1.txt", b"cut"),
               ("s2.jpg", good.getvalue())]
    shard = tmp_path / "mixed.tar"
    with tarfile.open(shard, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in entries:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with tarfile.open(shard) as tar:
        offsets = {m.name: m.offset for m in tar.getmembers()}
    code, out, _ = cli("verify", shard, "--require", "jpg,txt")
    assert code == 1
    fails = [line for line in out.splitlines() if line.startswith("FAIL")]
    assert len(fails) == 2
    assert "image does not decode" in fails[0] and f"member='s1.jpg', offset={offsets['s1.jpg']}" in fails[0]
    assert "has no 'txt'" in fails[1] and f"member='s2.jpg', offset={offsets['s2.jpg']}" in fails[1]
    assert str(shard) in fails[0]
    assert json.loads(out.splitlines()[-1])["failed"] == 1
    assert cli("verify", shard, "--no-decode", "--require", "jpg")[0] == 0


def test_stats_ls_and_bench(created):
    code, out, err = cli("stats", created, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert (report["shards"], report["samples"], report["images"]) == (4, SAMPLES, SAMPLES)
    assert report["fields"]["cls"]["count"] == SAMPLES and report["fields"]["png"]["count"] == 1
    assert report["fields"]["jpg"]["count"] == SAMPLES - 1 and report["fields"]["txt"]["count"] == 1
    assert sum(report["longer_side_histogram"].values()) == SAMPLES
    assert report["samples_per_shard"] == {"min": SAMPLES - 21, "median": 7.0, "mean": SAMPLES / 4, "max": 7}
    assert report["shard_samples"]["shard-000003.tar"] == SAMPLES - 21
    code, out, _ = cli("stats", created)
    assert code == 0 and "samples per shard" in out and "longer side" in out
    code, out, _ = cli("ls", created, "-n", 3)
    lines = out.splitlines()
    assert code == 0 and len(lines) == 3 and lines[0].startswith("shard-000000.tar\t") and "cls:1" in lines[0]
    code, out, err = cli("bench", created, "--decode", "--limit", 20)
    assert code == 0, err
    assert out.startswith("20 samples from 3 of 4 shards") and "verdict:" in out  # (7 + 7 + 6)


COMMANDS = ["create", "ls", "inspect", "stats", "verify", "index", "extract", "bench", "prepare"]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_with_examples(command, capsys):
    from shardstream.cli import main

    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and "examples:" in out and "exit status" in out and f"shardstream {command}" in out


def test_the_module_and_the_console_script_create_alike(folder, tmp_path):
    script = os.path.join(os.path.dirname(sys.executable), "shardstream")
    if not os.path.exists(script):
        pytest.skip("the console script is not installed")
    runs = []
    for name, argv in (("module", [sys.executable, "-m", "shardstream"]), ("script", [script])):
        done = subprocess.run([*argv, "create", str(folder), str(tmp_path / name), "--maxcount", "9", "--workers", "1"],
                              capture_output=True, text=True, timeout=120)
        runs.append((done.returncode, done.stdout.split(" in ")[0].replace(name, "X")))
    assert runs[0] == runs[1] and runs[0][0] == 0
    assert tree(tmp_path / "module") == tree(tmp_path / "script")


def test_odd_manifests_and_sizes_are_clear_errors(folder, tmp_path):
    """A .jsonl row that is not an object (it was an AttributeError traceback), a bad line
    (reported as line 1 whatever its number) and --maxsize nan (taken as no limit)."""
    image = str(next(p for p in (folder / "cat").iterdir() if p.suffix == ".jpg"))
    (tmp_path / "list.jsonl").write_text("[1, 2]\n")
    code, _, err = cli("create", tmp_path / "list.jsonl", tmp_path / "a")
    assert code == 1 and "line 1: want a JSON object" in err and "Traceback" not in err
    (tmp_path / "bad.jsonl").write_text(json.dumps({"url": image}) + "\n{bad json\n")
    code, _, err = cli("create", tmp_path / "bad.jsonl", tmp_path / "b")
    assert code == 1 and "bad.jsonl: line 2:" in err
    for size in ("nan", "inf"):
        code, _, err = cli("create", folder, tmp_path / "c", "--maxsize", size)
        assert code == 2 and "--maxsize must be a positive number" in err, err


def test_the_temp_files_of_dead_writers_on_this_host_are_cleaned_up(folder, tmp_path):
    """A worker killed mid-shard leaves its temp file; the next run into DEST removes it (it
    survived --overwrite), but not a live writer's, nor one from another host sharing DEST."""
    import subprocess
    import sys

    from shardstream._base.processes import temp_name

    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)
    dest = tmp_path / "out"
    dest.mkdir()
    left = {temp_name("shard-000001.tar", dead): False,
            temp_name("shard-000002.tar", os.getpid()): True,
            f".shard-000003.tar.some-other-host.{dead}.0123abcd.tmp": True}
    for name in left:
        (dest / name).write_bytes(b"partial")
    code, _, err = cli("create", folder, dest, "--maxcount", 50, "--workers", 1, "--overwrite")
    assert code == 0, err
    assert {name: (dest / name).exists() for name in left} == left
