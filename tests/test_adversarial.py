"""What an attacker or a careless user tried (issue tracker: reliability and security), kept so it
stays fixed. Each case goes through the public API: the loader, its handlers and logs, the CLI."""

from __future__ import annotations

import base64
import gzip
import json
import logging
import os
import socketserver
import subprocess
import sys
import threading
import traceback
import warnings

import pytest

import shardstream as wds
from shardsets import fails_at_header, liar_shard, sample_members, write_tar

PASSWORD = "pa@ss:Zq9w0rd"  # "@" and ":" inside: the userinfo runs to the last "@"
TOKEN = "Zq9tok3n"
SIGNATURE = "Zq9sign4ture"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("adversarial")
    write_tar(str(root / "a.tar"), [m for i in range(3) for m in sample_members(i, exts=("cls", "txt"))])
    return str(root), None


def _secret_url(server, name="a.tar"):
    base = server.url(name)
    return base.replace("http://", f"http://user:{PASSWORD}@") + f"?token={TOKEN}&X-Goog-Signature={SIGNATURE}"


def _assert_no_secret(*texts):
    for text in texts:
        for secret in (PASSWORD, "Zq9w0rd", TOKEN, SIGNATURE):
            assert secret not in str(text), f"{secret!r} leaked in {str(text)[:300]!r}"


# --- secrets never shown ------------------------------------------------------------------------

def test_a_failing_secret_url_never_shows_its_secrets(caplog):
    url = f"http://user:{PASSWORD}@127.0.0.1:9/a.tar?token={TOKEN}&X-Goog-Signature={SIGNATURE}"  # nothing listens
    options = wds.FetchOptions(retries=1, backoff_base=0.01, backoff_max=0.02, connect_timeout=1.0)
    caplog.set_level(logging.DEBUG)
    with pytest.raises(wds.FetchError) as caught:
        list(wds.WebDataset(url, shardshuffle=False, fetch_options=options))
    _assert_no_secret(caught.value, repr(caught.value), caught.value.url, caplog.text)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        list(wds.WebDataset(url, shardshuffle=False, fetch_options=options, handler=wds.warn_and_continue,
                            empty_check=False))
    assert seen
    _assert_no_secret(*(w.message for w in seen), caplog.text)


class _Answer(socketserver.BaseRequestHandler):
    """Reads a request and answers `server.answer(path)` raw: a redirect to itself, or garbage."""

    def handle(self):
        self.request.settimeout(5)
        request = b""
        while b"\r\n\r\n" not in request:
            data = self.request.recv(4096)
            if not data:
                return
            request += data
        self.request.sendall(self.server.answer(request.split(b" ")[1].decode()))


@pytest.fixture
def raw_server():
    servers = []

    def start(answer):
        server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Answer)
        server.daemon_threads = True
        server.answer = answer
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


ANSWERS = {
    # "Connection: close": each answer on its own connection, so the client's error is the
    # redirect loop's, not a reused connection the server has closed
    "redirect loop": lambda path: (f"HTTP/1.1 302 Found\r\nLocation: {path}\r\nContent-Length: 0\r\n"
                                   "Connection: close\r\n\r\n").encode(),
    "not http": lambda path: b"NOT HTTP AT ALL\r\n\r\n",
}


@pytest.mark.parametrize("answer", sorted(ANSWERS))
def test_a_third_party_error_under_ours_shows_no_secret(raw_server, answer):
    """aiohttp's errors print the URL they were given and their request's headers (Basic auth
    from the URL's userinfo): chained under our error, they must not show them in a printed
    traceback or a warning."""
    url = f"http://user:{PASSWORD}@{raw_server(ANSWERS[answer])}/a.tar?token={TOKEN}&X-Goog-Signature={SIGNATURE}"
    basic = base64.b64encode(f"user:{PASSWORD}".encode()).decode()
    options = wds.FetchOptions(retries=1, backoff_base=0.01, backoff_max=0.02)
    with pytest.raises(wds.FetchError) as caught:
        list(wds.WebDataset(url, shardshuffle=False, fetch_options=options))
    printed = "".join(traceback.format_exception(caught.value))
    assert caught.value.__cause__ is not None and "aiohttp" in printed  # the cause is still told
    _assert_no_secret(printed, basic)
    assert basic not in printed
    for handler in (wds.warn_and_continue, wds.warn_and_stop):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            list(wds.WebDataset(url, shardshuffle=False, fetch_options=options, handler=handler, empty_check=False))
        assert seen
        for warning in seen:
            _assert_no_secret(warning.message)
            assert basic not in str(warning.message)


def test_pipe_commands_are_redacted_in_errors():
    url = f"pipe:curl -s -u bob:{PASSWORD} 'http://127.0.0.1:9/a.tar?token={TOKEN}'"
    with pytest.raises(wds.UsageError) as caught:
        list(wds.WebDataset(url, shardshuffle=False))
    _assert_no_secret(caught.value)
    assert "pipe:" in str(caught.value)


def test_the_info_stage_redacts_urls(server, capsys):
    server.options.basic_auth = ("user", PASSWORD)
    server.options.require_token = TOKEN
    try:
        list(wds.WebDataset(_secret_url(server), shardshuffle=False).compose(wds.filters.info(n=1)))
    finally:
        server.options.basic_auth = None
        server.options.require_token = None
    _assert_no_secret(capsys.readouterr().err)


def _cli(*args, cwd):
    done = subprocess.run([sys.executable, "-m", "shardstream", *args], capture_output=True, text=True, timeout=60,
                          cwd=cwd)
    return done.returncode, done.stdout + done.stderr


def test_the_cli_never_prints_or_writes_secrets(server, tmp_path):
    server.options.basic_auth = ("user", PASSWORD)
    server.options.require_token = TOKEN
    try:
        url = _secret_url(server)
        code, out = _cli("inspect", url, "-n", "2", cwd=tmp_path)
        assert code == 0 and '"__key__": "s0000"' in out
        _assert_no_secret(out)
        code, out = _cli("verify", "-v", url, cwd=tmp_path)
        assert code == 0 and "3 samples" in out
        _assert_no_secret(out)
        code, out = _cli("index", url, cwd=tmp_path)  # remote shards: where would sizes.json go?
        assert code == 2 and "--sizes" in out and not os.listdir(tmp_path)  # a command-line mistake
        code, out = _cli("index", url, "--sizes", str(tmp_path / "sizes.json"), cwd=tmp_path)
        assert code == 0
        _assert_no_secret(out, (tmp_path / "sizes.json").read_text())
        assert json.loads((tmp_path / "sizes.json").read_text()) == {"a.tar": 3}
        code, out = _cli("verify", url.replace("a.tar", "missing.tar"), cwd=tmp_path)
        assert code == 1 and "missing.tar" in out
        _assert_no_secret(out)
    finally:
        server.options.basic_auth = None
        server.options.require_token = None


# --- clear errors instead of tracebacks --------------------------------------------------------

def test_decode_errors_under_warn_and_continue_say_why(tmp_path):
    shard = write_tar(str(tmp_path / "j.tar"), [("s0.json", b"{not json"), ("s1.json", b'{"ok": 1}')])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = list(wds.WebDataset(shard, shardshuffle=False).decode(handler=wds.warn_and_continue))
    assert [s["json"] for s in got] == [{"ok": 1}]
    assert any("JSONDecodeError" in str(w.message) for w in seen), [str(w.message) for w in seen]


@pytest.mark.parametrize("names", [["a", "a/b.txt"], ["x\0y.txt"]])
def test_extract_reports_bad_member_names_without_a_traceback(tmp_path, names):
    import io
    import tarfile

    shard = tmp_path / "odd.tar"
    with tarfile.open(shard, "w", format=tarfile.PAX_FORMAT) as tar:
        for name in names:
            info = tarfile.TarInfo("placeholder" if "\0" in name else name)
            if "\0" in name:
                info.pax_headers = {"path": name}
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
    dest = tmp_path / "out"
    code, out = _cli("extract", str(shard), str(dest), cwd=tmp_path)
    assert code == 1 and out.startswith("error: ") and "Traceback" not in out
    assert "member=" in out and "offset=" in out


# --- saved states are checked, never accepted blindly ---------------------------------------------

@pytest.fixture(scope="module")
def two_datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("states")
    first = [write_tar(str(root / f"a-{n}.tar"), [m for i in range(n * 5, n * 5 + 5) for m in sample_members(i, exts=("cls",))])
             for n in range(3)]
    other = [write_tar(str(root / f"b-{n}.tar"), [m for i in range(n * 5, n * 5 + 5) for m in sample_members(i, exts=("cls",))])
             for n in range(3)]
    return first, other


def _dataset(shards):
    return wds.WebDataset(shards, shardshuffle=False).to_tuple("__key__")


def _state_after(shards, n):
    ds = _dataset(shards)
    it = iter(ds)
    for _ in range(n):
        next(it)
    return ds.state_dict()


def test_a_state_from_another_dataset_is_refused(two_datasets):
    first, other = two_datasets
    state = _state_after(first, 4)
    with pytest.raises(wds.UsageError, match="another dataset"):
        _dataset(other).load_state_dict(state)
    with pytest.raises(wds.UsageError, match="another pipeline"):
        _dataset(first).batched(2).load_state_dict(state)


def _saved(build, n=4):
    ds = build()
    it = iter(ds)
    for _ in range(n):
        next(it)
    return json.loads(json.dumps(ds.state_dict()))  # (as a checkpoint holds it)


@pytest.mark.parametrize("change", ["seed", "shuffle seed", "shard shuffle", "split seed", "weights", "with_epoch"])
def test_a_state_saved_under_other_settings_is_refused(two_datasets, change, monkeypatch):
    """A position means other samples under another seed (the saved shard offset was entered in
    another shard: 13 of 60 samples repeated and 13 lost, no error), other weights or a shorter
    with_epoch (an empty epoch): the settings are in the fingerprint, and the same ones load."""
    first, other = two_datasets
    spec = f"{first[0]}::{other[0]}"

    def build(v):
        if change == "seed":
            return wds.WebDataset(first, shardshuffle=10, seed=v).to_tuple("__key__")
        if change == "shuffle seed":
            return wds.WebDataset(first, shardshuffle=False).shuffle(5, seed=v).to_tuple("__key__")
        if change == "shard shuffle":
            return wds.WebDataset(first, shardshuffle=v, seed=1).to_tuple("__key__")
        if change == "split seed":
            monkeypatch.setenv("RANK", "0")
            monkeypatch.setenv("WORLD_SIZE", "2")
            return wds.WebDataset(first + other, shardshuffle=False, nodesplitter=wds.EqualSplit(seed=v)).to_tuple("__key__")
        if change == "weights":
            return wds.WebDataset(spec, resampled=True, seed=1, weights=f"1::{v}").with_epoch(20).to_tuple("__key__")
        return wds.WebDataset(first, resampled=True, seed=1).with_epoch(10 * v).to_tuple("__key__")

    state = _saved(lambda: build(2))
    build(2).load_state_dict(state)  # (the same settings, after a JSON round trip)
    with pytest.raises(wds.UsageError, match="other settings"):
        build(3).load_state_dict(state)


def test_a_mix_state_names_the_datasets_mixed(two_datasets):
    """A RandomMix's state said only "RandomMix": one saved over other datasets loaded."""
    first, other = two_datasets
    mix = lambda a, b: wds.DataPipeline(wds.RandomMix([_dataset(a), _dataset(b)], seed=3))  # noqa: E731
    state = _saved(lambda: mix(first, other))
    mix(first, other).load_state_dict(state)
    with pytest.raises(wds.UsageError, match="other settings"):
        mix(first, first).load_state_dict(state)
    robin = lambda a, b: wds.DataPipeline(wds.RoundRobin([_dataset(a), _dataset(b)]))  # noqa: E731
    with pytest.raises(wds.UsageError, match="other settings"):
        robin(first, first).load_state_dict(_saved(lambda: robin(first, other)))


def test_a_state_saved_before_settings_were_recorded_loads(two_datasets):
    first, _ = two_datasets
    build = lambda: wds.WebDataset(first, shardshuffle=False).shuffle(5, seed=1).to_tuple("__key__")  # noqa: E731
    state = _saved(build)
    del state["fingerprint"]["settings"]
    build().load_state_dict(state)


def test_re_signed_urls_are_the_same_dataset():
    from shardstream._resume.statecheck import fingerprint

    urls = [f"https://bucket.example/train-{i}.tar" for i in range(3)]
    signed = lambda sig: [f"{u}?X-Amz-Signature={sig}&X-Amz-Date=1" for u in urls]  # noqa: E731
    prints = [fingerprint([wds.SimpleShardList(u)]) for u in (urls, signed("a"), signed("b"))]
    assert prints[0] == prints[1] == prints[2]
    assert fingerprint([wds.SimpleShardList(urls[:2])]) != prints[0]


@pytest.mark.parametrize("garbage, message", [
    ({"foo": 1}, "not a saved dataset state"),
    ({}, "not a saved dataset state"),
    (None, "got NoneType"),
    ("state", "got str"),
    ([], "empty"),
    ({"delivered": -1}, "count >= 0"),
    ({"delivered": 1, "position": [0, "x", 0, 0]}, "malformed resume position"),
])
def test_garbage_states_are_refused(two_datasets, garbage, message):
    with pytest.raises(wds.UsageError, match=message):
        _dataset(two_datasets[0]).load_state_dict(garbage)


def test_a_newer_format_is_refused_and_an_older_one_loads(two_datasets):
    first, _ = two_datasets
    state = _state_after(first, 4)
    with pytest.raises(wds.UsageError, match="newer shardstream"):
        _dataset(first).load_state_dict(dict(state, format=99))
    older = {k: v for k, v in state.items() if k not in ("format", "fingerprint")}
    ds = _dataset(first)
    ds.load_state_dict(older)
    assert [k for (k,) in ds] == [f"s{i:04d}" for i in range(4, 15)]


@pytest.mark.parametrize("change", [
    dict(delivered=10**9, position=None),  # replayed: the epoch is shorter
    dict(position=[0, 50, 0, 0]),  # seek: past the last shard
])
def test_out_of_range_positions_are_an_error_not_an_empty_epoch(two_datasets, change):
    first, _ = two_datasets
    ds = _dataset(first)
    ds.load_state_dict(dict(_state_after(first, 4), **change))
    with pytest.raises(wds.UsageError, match="another dataset"):
        list(ds)


def test_a_count_position_past_the_end_is_an_error(two_datasets):
    first, _ = two_datasets
    build = lambda: wds.WebDataset(first, shardshuffle=False).shuffle(5, seed=1).to_tuple("__key__")  # noqa: E731
    ds = build()
    it = iter(ds)
    next(it)
    state = ds.state_dict()
    assert len(state["position"]) == 2  # a count position (a shuffle holds samples back)
    resumed = build()
    resumed.load_state_dict(dict(state, position=[0, 10**6]))
    with pytest.raises(wds.UsageError, match="another dataset"):
        list(resumed)


# --- verify is exactly as strict as the loader ---------------------------------------------------

def _bad_shards(root):
    import io
    import tarfile

    def tar(path, entries, fmt=tarfile.USTAR_FORMAT, global_headers=None):
        with tarfile.open(path, "w", format=fmt, pax_headers=global_headers or {}) as out:
            for name, data in entries:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                out.addfile(info, io.BytesIO(data))
        return str(path)

    good = [(f"s{i}.{ext}", b"x") for i in range(4) for ext in ("cls", "txt")]
    shards = {
        "good": tar(root / "good.tar", good),
        "duplicate member": tar(root / "dup.tar", good[:2] + [("s0.txt", b"again")] + good[2:]),
        "PAX global path": tar(root / "global.tar", good, tarfile.PAX_FORMAT, {"path": "same.txt"}),
    }
    whole = open(shards["good"], "rb").read()
    (root / "concat.tar").write_bytes(whole + whole)
    shards["concatenated archives"] = str(root / "concat.tar")
    # `cat a.tar.gz b.tar.gz`: the second archive was dropped in silence (webdataset drops it too)
    (root / "concat.tar.gz").write_bytes(gzip.compress(whole) + gzip.compress(whole))
    shards["concatenated gzipped archives"] = str(root / "concat.tar.gz")
    (root / "padded.tar.gz").write_bytes(gzip.compress(whole) + b"\0" * 1000)  # junk after the stream: ignored
    shards["good"], shards["good, padded"] = shards["good"], str(root / "padded.tar.gz")
    return shards


def test_verify_fails_exactly_the_shards_the_loader_fails(tmp_path):
    for kind, shard in _bad_shards(tmp_path).items():
        try:
            list(wds.WebDataset(shard, shardshuffle=False))
            loader_ok = True
        except wds.FormatError:
            loader_ok = False
        code, out = _cli("verify", shard, cwd=tmp_path)
        assert (code == 0) == loader_ok == kind.startswith("good"), (kind, out)


def test_a_shard_cut_at_a_member_boundary_fails_when_its_count_says_more(tmp_path, monkeypatch):
    shard = write_tar(str(tmp_path / "cut.tar"), [m for i in range(4) for m in sample_members(i, exts=("cls",))])
    (tmp_path / "sizes.json").write_text(json.dumps({"cut.tar": 6}))  # written before the shard lost samples
    code, out = _cli("verify", shard, cwd=tmp_path)
    assert code == 1 and "sizes.json / .idx says 6" in out
    summary = json.loads(out.strip().splitlines()[-1])  # a shard read to its end: its figures count
    assert (summary["shards"], summary["samples"], summary["failed"]) == (1, 4, 1)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    other = write_tar(str(tmp_path / "other.tar"), [m for i in range(10, 16) for m in sample_members(i, exts=("cls",))])
    splitter = wds.EqualSplit(counts={"cut.tar": 6, "other.tar": 6}, shuffle=False)
    with pytest.raises(wds.FormatError, match="says at least 6"):
        list(wds.WebDataset([shard, other], shardshuffle=False, nodesplitter=splitter))


def test_a_huge_claimed_size_fails_at_its_header_without_buffering_the_shard(tmp_path):
    path = tmp_path / "liar.tar"
    path.write_bytes(liar_shard(48))  # 48 MiB follow, not 8 GiB
    error, peak = fails_at_header(lambda: list(wds.WebDataset(str(path), shardshuffle=False)))
    assert error.member == "s0.bin" and error.offset == 0
    assert peak < 8 << 20, peak


def test_decode_says_how_to_allow_pickles_in_a_way_that_works(tmp_path):
    import pickle

    shard = write_tar(str(tmp_path / "p.tar"), [("s0.pyd", pickle.dumps({"a": 1}))])
    with pytest.raises(wds.UsageError, match=r"\.decode\(\.\.\., allow_pickle=True\)"):
        list(wds.WebDataset(shard, shardshuffle=False).decode())
    assert [s["pyd"] for s in wds.WebDataset(shard, shardshuffle=False).decode(allow_pickle=True)] == [{"a": 1}]


@pytest.mark.parametrize("spec", ["a.tar::", "", "::b.tar"])
def test_empty_urls_are_a_usage_error_not_shard_not_found(spec):
    with pytest.raises(wds.UsageError, match="empty shard URL"):
        wds.WebDataset(spec, shardshuffle=False)


@pytest.mark.timeout(60)
def test_a_huge_claimed_size_over_http_fails_at_its_header(server):
    path = os.path.join(str(server.root), "liar-remote.tar")
    with open(path, "wb") as f:
        f.write(liar_shard(32))  # 32 MiB follow, not 8 GiB
    try:
        for parts in (1, 16):  # one plain GET, and ranged parts
            options = wds.FetchOptions(parallel_parts=parts)
            error, peak = fails_at_header(
                lambda: list(wds.WebDataset(server.url("liar-remote.tar"), shardshuffle=False, fetch_options=options)))
            assert error.member == "s0.bin" and peak < 12 << 20, peak
    finally:
        os.remove(path)


def test_a_seed_from_wds_seed_and_the_same_seed_in_code_are_one_setting(two_datasets, monkeypatch):
    """WDS_SEED=3 arrives as text: a state saved under it was refused by seed=3."""
    first, _ = two_datasets
    monkeypatch.setenv("WDS_SEED", "3")
    state = _saved(lambda: wds.WebDataset(first, shardshuffle=10).shuffle(5).to_tuple("__key__"))
    monkeypatch.delenv("WDS_SEED")
    wds.WebDataset(first, shardshuffle=10, seed=3).shuffle(5).to_tuple("__key__").load_state_dict(state)
