"""What an attacker or a careless user tried (issue tracker: reliability and security), kept so it
stays fixed. Each case goes through the public API: the loader, its handlers and logs, the CLI."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import warnings

import pytest

import shardstream as wds
from shardsets import sample_members, write_tar

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
        assert code == 1 and "--sizes" in out and not os.listdir(tmp_path)
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
