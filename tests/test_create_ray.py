"""`shardstream create --engine ray`: Ray Data tasks write the same bytes as the local engine.

The command starts a local Ray for the job (2 CPUs, loopback, no dashboard) and stops it; the
test bounds it in time. Skipped where Ray is not installed (`pip install 'shardstream[ray]'`)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("ray", reason="Ray is not installed: pip install 'shardstream[ray]'")

pytestmark = pytest.mark.timeout(240)


def cli(*args, timeout=200):
    done = subprocess.run([sys.executable, "-m", "shardstream", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)
    return done.returncode, done.stdout, done.stderr


def tree(root) -> dict:
    return {name: open(os.path.join(root, name), "rb").read() for name in sorted(os.listdir(root))}


def test_the_ray_engine_writes_what_the_local_engine_writes(tmp_path):
    rng = np.random.default_rng(1)
    for label in ("a", "b"):
        (tmp_path / "src" / label).mkdir(parents=True)
        for i in range(12):
            pixels = rng.integers(0, 255, (40 + 3 * i, 60, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / "src" / label / f"{i}.jpg", quality=90)
    (tmp_path / "src" / "a" / "broken.jpg").write_bytes(b"not a jpeg")
    common = ["--maxcount", 9, "--seed", 7, "--max-side", 48, "--skip-errors"]
    code, _, err = cli("create", tmp_path / "src", tmp_path / "local", *common, "--workers", 1)
    assert code == 0, err
    code, out, err = cli("create", tmp_path / "src", tmp_path / "ray", *common, "--engine", "ray", "--workers", 2)
    assert code == 0, err
    assert "ray engine, 2 workers" in out and "left out: sample 'a/broken'" in out
    assert tree(tmp_path / "ray") == tree(tmp_path / "local")
    assert sorted(n for n in tree(tmp_path / "ray") if n.endswith(".tar")) == [f"shard-{i:06d}.tar" for i in range(3)]
