"""The tools: the demo and the OpenCLIP-style training script run end to end."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

import shardstream as wds
from needs import needs_torch

TOOLS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "tools")


@pytest.fixture(scope="module")
def image_text_shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("clip")
    rng = np.random.default_rng(0)
    with wds.ShardWriter(str(root / "clip-%03d.tar"), maxcount=40, verbose=0) as sink:
        for i in range(120):
            buf = io.BytesIO()
            Image.fromarray(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(buf, format="JPEG")
            sink.write({"__key__": f"k{i:04d}", "jpg": buf.getvalue(), "txt": f"caption {i}"})
    return str(root / "clip-{000..002}.tar")


@pytest.mark.timeout(180)
@needs_torch
def test_training_script_runs_and_checkpoints(image_text_shards, tmp_path):
    cmd = [sys.executable, os.path.join(TOOLS, "train_clip_style.py"), image_text_shards,
           "--epochs", "2", "--batch-size", "8", "--workers", "0", "--checkpoint", str(tmp_path / "ckpt")]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=170)
    assert result.returncode == 0, result.stderr[-3000:]
    epochs = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [e["epoch"] for e in epochs] == [0, 1]
    assert all(e["samples"] == 120 and e["steps"] == 15 for e in epochs)
    assert os.path.exists(tmp_path / "ckpt.rank0")
    # run again: it resumes epoch 1 after the checkpoint taken at its step 10 (15 steps an epoch)
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=170)
    assert again.returncode == 0, again.stderr[-3000:]
    resumed = [json.loads(line) for line in again.stdout.splitlines() if line.startswith("{")]
    assert [(e["epoch"], e["steps"], e["samples"]) for e in resumed] == [(1, 5, 40)]
