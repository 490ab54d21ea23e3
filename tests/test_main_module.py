"""`python -m shardstream` is the `shardstream` command: same help, same output."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest


def _console_script():
    beside = os.path.join(os.path.dirname(sys.executable), "shardstream")
    return beside if os.path.exists(beside) else shutil.which("shardstream")


def _run(argv):
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def test_help():
    done = _run([sys.executable, "-m", "shardstream", "--help"])
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: shardstream ")
    for command in ("inspect", "verify", "index", "extract", "prepare"):
        assert command in done.stdout


@pytest.mark.skipif(_console_script() is None, reason="the console script is not installed")
def test_same_output_as_the_console_script(shardset):
    spec = "::".join(shardset[:2])
    for argv in (["--help"], ["inspect", spec, "-n", "4"], ["verify", spec]):
        module = _run([sys.executable, "-m", "shardstream", *argv])
        script = _run([_console_script(), *argv])
        assert module.returncode == script.returncode == 0, (argv, module.stderr, script.stderr)
        assert module.stdout == script.stdout and module.stdout
        assert module.stderr == script.stderr


def test_errors_exit_like_the_console_script(tmp_path):
    missing = str(tmp_path / "missing.tar")
    module = _run([sys.executable, "-m", "shardstream", "verify", missing])
    assert module.returncode == 1 and missing in module.stdout + module.stderr
    bad = _run([sys.executable, "-m", "shardstream", "no-such-command"])
    assert bad.returncode == 2 and "usage: shardstream" in bad.stderr
