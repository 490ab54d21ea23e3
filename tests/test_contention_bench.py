"""A smoke run of benchmarks/contention.py (the benchmark itself is `make bench`'s): a tiny
corpus, one workload, the helper-process loader; it must finish, count every
sample, print its table and write its plot."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from needs import needs_torch

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "contention.py")


@pytest.mark.timeout(120)
@needs_torch
def test_contention_benchmark_smoke(tmp_path):
    command = [
        sys.executable, SCRIPT, "--samples", "48", "--shards", "2", "--batch", "8", "--step-ms", "2",
        "--workloads", "text", "--configs", "shardstream-subprocess",
        "--out", str(tmp_path / "out"), "--corpus-dir", str(tmp_path / "corpus"),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=110)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "cores=" in result.stdout and "shardstream-subprocess" in result.stdout
    assert (tmp_path / "out" / "contention.png").stat().st_size > 0
