"""webdataset 1.0.2's own test suite (tests/webdataset_suite/) passes on shardstream.

It runs in a separate pytest process: its conftest installs shardstream as `webdataset`, which
must not leak into this process, where the differential tests import the real webdataset 1.0.2.
In this process that conftest is inert and ignores the folder's files (see its docstring).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from needs import needs_torch

SUITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "webdataset_suite")


def _counts(summary: str) -> dict:
    return {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)", summary)}


@pytest.mark.timeout(400)
@needs_torch
def test_webdataset_suite_passes_on_shardstream():
    env = dict(os.environ, SHARDSTREAM_WDS_SUITE="1", PYTHONDONTWRITEBYTECODE="1")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", f"--rootdir={SUITE}",
         f"--confcutdir={SUITE}", "--timeout=120", SUITE],
        capture_output=True, text=True, env=env, timeout=360,
    )
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    counts = _counts(summary)
    report = f"{summary}\n--- output tail ---\n{done.stdout[-6000:]}\n{done.stderr[-3000:]}"
    assert done.returncode == 0, report
    assert counts.get("failed", 0) == 0 and counts.get("error", 0) == counts.get("errors", 0) == 0, report
    # 193 tests in the 14 files; what may be skipped is listed, with reasons, in its conftest
    assert counts.get("passed", 0) >= 175, report
    assert counts.get("passed", 0) + counts.get("skipped", 0) == 193, report


def test_the_suite_folder_is_inert_here():
    """This session imported the real webdataset, not shardstream under its name."""
    import webdataset

    assert webdataset.__name__ == "webdataset" and "shardstream" not in webdataset.__file__
    assert "tests.conftest" not in sys.modules or "webdataset_suite" not in getattr(sys.modules["tests.conftest"], "__file__", "")
    assert SUITE not in sys.path  # its test_decode.py etc. would shadow ours
