"""OpenCLIP's own training entry point on shardstream, end to end: open-clip-torch 3.3.0's
`open_clip_train.main`, unmodified, run as

    torchrun --nproc_per_node=2 -m -- shardstream.run -m open_clip_train.main --dataset-type webdataset ...

(gloo on CPU, two DataLoader workers per rank) on a generated jpg+txt shard set, with a tiny CLIP
given through OpenCLIP's own `local-dir:` model schema. Once with `--dataset-resampled
--train-num-samples N` (OpenCLIP's ResampledShards2) and once without (its SimpleShardList,
detshuffle2, split_by_node, split_by_worker pipeline sized by a sizes.json). Each run: every rank
trains the same number of steps, every loss is finite, the checkpoint is written; without
resampling, each epoch trains on every sample exactly once across the two ranks.

OpenCLIP needs torchvision, whose index build needs the index's torch, not the CPU torch of the test
venv: it runs in its own venv (.venv-clip), which `make test` builds and names in OPENCLIP_PYTHON.
A passive probe (tests/scripts/openclip_probe/sitecustomize.py) records each rank's steps through
torch's global hooks.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import signal
import socket
import subprocess
import time

import numpy as np
import pytest
from PIL import Image
from shardsets import write_tar

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PROBE = os.path.join(HERE, "scripts", "openclip_probe")
CLIP_PYTHON = os.environ.get("OPENCLIP_PYTHON") or os.path.join(REPO, ".venv-clip", "bin", "python")

SHARD_SIZES = [20, 36, 28, 44, 24, 40, 32, 32]  # 256 samples, uneven shards
BATCH, WORKERS, RANKS, EPOCHS = 16, 2, 2, 2

# A CLIP small enough to train in seconds on CPU (OpenCLIP's default SimpleTokenizer: 49408 tokens).
TINY_CLIP = {
    "model_cfg": {
        "embed_dim": 32,
        "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "patch_size": 8, "head_width": 32},
        "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2},
    }
}


@pytest.fixture(scope="module")
def clip_python():
    if not os.path.exists(CLIP_PYTHON):
        if os.environ.get("OPENCLIP_PYTHON"):
            pytest.fail(f"OPENCLIP_PYTHON={CLIP_PYTHON} does not exist")
        pytest.skip(f"no OpenCLIP venv at {CLIP_PYTHON}: `make test` builds it (or set OPENCLIP_PYTHON)")
    return CLIP_PYTHON


@pytest.fixture(scope="module")
def caption_shards(tmp_path_factory):
    """Eight jpg+txt shards with a sizes.json (which OpenCLIP and the equal-work splitter read)."""
    root = tmp_path_factory.mktemp("captions")
    sizes, index = {}, 0
    for n, size in enumerate(SHARD_SIZES):
        members = []
        for i in range(index, index + size):
            pixels = np.random.default_rng(i).integers(0, 255, size=(40, 48, 3), dtype=np.uint8)
            jpeg = io.BytesIO()
            Image.fromarray(pixels).save(jpeg, format="JPEG")
            members += [(f"{i:06d}.jpg", jpeg.getvalue()), (f"{i:06d}.txt", f"a photo of sample {i}".encode())]
        name = f"train-{n:03d}.tar"
        write_tar(str(root / name), members)
        sizes[name] = size
        index += size
    (root / "sizes.json").write_text(json.dumps(sizes))
    model = tmp_path_factory.mktemp("tiny-clip")
    (model / "open_clip_config.json").write_text(json.dumps(TINY_CLIP))
    return str(root / f"train-{{000..{len(SHARD_SIZES) - 1:03d}}}.tar"), str(model)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(python, shards, model, workdir, name, *extra):
    """Run OpenCLIP's main under torchrun; return (per-rank probe records, OpenCLIP's log, seconds)."""
    probe = workdir / "probe"
    probe.mkdir(parents=True)
    cmd = [
        python, "-m", "torch.distributed.run", f"--nproc_per_node={RANKS}", "--master_addr=127.0.0.1",
        f"--master_port={_free_port()}", "-m", "--", "shardstream.run", "-m", "open_clip_train.main",
        "--train-data", shards, "--dataset-type", "webdataset", *extra,
        "--model", f"local-dir:{model}", "--batch-size", str(BATCH), "--workers", str(WORKERS),
        "--epochs", str(EPOCHS), "--lr", "1e-3", "--warmup", "2", "--precision", "fp32", "--seed", "0",
        "--device", "cpu", "--dist-backend", "gloo", "--log-every-n-steps", "1",
        "--logs", str(workdir / "logs"), "--name", name,
    ]  # the `--`: without it torchrun's parser takes OpenCLIP's --logs for an ambiguous --logs-specs
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=PROBE, OPENCLIP_PROBE_DIR=str(probe), HF_HUB_OFFLINE="1")
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun and both ranks with their workers
        output, _ = proc.communicate()
        pytest.fail("OpenCLIP run timed out:\n" + output[-4000:])
    seconds = time.monotonic() - start
    assert proc.returncode == 0, output[-6000:]
    ranks = [json.loads((probe / f"rank{r}.json").read_text()) for r in range(RANKS)]
    log = (workdir / "logs" / name / "out.log").read_text()
    return ranks, log, seconds


def _check_run(ranks, log, workdir, name, steps_per_epoch):
    assert [r["steps"] for r in ranks] == [steps_per_epoch * EPOCHS] * RANKS
    for r in ranks:
        assert all(math.isfinite(loss) for loss in r["losses"]), r["losses"]
        assert all(len(texts) == BATCH for texts in r["texts"])
    # OpenCLIP's own log (rank 0) has one line per step, with a finite loss.
    lines = re.findall(r"Train Epoch: \d+ .*Batch \(t\): ([\d.]+).* Loss: ([\d.naif]+)", log)
    assert len(lines) == steps_per_epoch * EPOCHS
    assert all(math.isfinite(float(loss)) for _, loss in lines)
    torch = pytest.importorskip("torch")
    checkpoint = torch.load(workdir / "logs" / name / "checkpoints" / f"epoch_{EPOCHS}.pt", weights_only=True)
    assert checkpoint["epoch"] == EPOCHS and checkpoint["state_dict"]
    return 1.0 / float(lines[-1][0])  # steps/s, OpenCLIP's running average of its batch time


@pytest.mark.timeout(300)
def test_openclip_main_resampled(clip_python, caption_shards, tmp_path):
    shards, model = caption_shards
    ranks, log, seconds = _train(clip_python, shards, model, tmp_path, "resampled",
                                 "--dataset-resampled", "--train-num-samples", "200")
    # OpenCLIP's sizing: ceil(200 / (16 * 2)) = 7 batches, rounded up to a multiple of 2 workers.
    steps_per_s = _check_run(ranks, log, tmp_path, "resampled", steps_per_epoch=8)
    print(f"OpenCLIP resampled: {seconds:.1f} s wall, {steps_per_s:.1f} steps/s")


@pytest.mark.timeout(300)
def test_openclip_main_split_by_node(clip_python, caption_shards, tmp_path):
    shards, model = caption_shards
    ranks, log, seconds = _train(clip_python, shards, model, tmp_path, "split")
    # sizes.json gives 256 samples: 8 batches of 16 per rank, 4 per DataLoader worker.
    steps_per_s = _check_run(ranks, log, tmp_path, "split", steps_per_epoch=8)
    print(f"OpenCLIP split_by_node: {seconds:.1f} s wall, {steps_per_s:.1f} steps/s")
    # The equal-work splitter: in each epoch the two ranks train on disjoint halves, and together on
    # every sample exactly once.
    for epoch in range(EPOCHS):
        seen = [[t for step in r["texts"][epoch * 8:(epoch + 1) * 8] for t in step] for r in ranks]
        assert len(seen[0]) == len(seen[1]) == sum(SHARD_SIZES) // RANKS
        assert len(set(seen[0]) | set(seen[1])) == sum(SHARD_SIZES)
