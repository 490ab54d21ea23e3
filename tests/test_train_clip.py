"""tools/train_clip.py end to end: torchrun with two ranks (gloo, CPU) on a synthetic caption
dataset from tools/make_clip_shards.py. The loss falls; a run stopped mid-epoch and resumed from
its checkpoint trains on exactly the samples (and, on the same layout, with exactly the losses) of
the uninterrupted run, on two ranks and on one; resampled `::` sources with upsampling factors,
the subprocess loader, bad samples and HTTP with the cache run too."""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import sys

import pytest
from needs import needs_torch

TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools")
TRAIN = 384  # samples: 4 shards (100, 100, 100, 84); 2 ranks x 24 steps of 8 a epoch, nothing dropped
BATCH = 8
COMMON = ["--batch-size", str(BATCH), "--image-size", "32", "--epochs", "2", "--log-every", "4",
          "--save-every", "0", "--lr", "1e-3", "--shuffle-buffer", "64"]


def _make(out, *extra):
    cmd = [sys.executable, os.path.join(TOOLS, "make_clip_shards.py"), str(out), *extra]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def clip_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("clipdata")
    _make(root, "--train", str(TRAIN), "--shard-size", "100", "--eval", "64")
    _make(root, "--prefix", "extra", "--train", "200", "--shard-size", "100", "--eval", "0", "--seed", "1")
    return root


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(out, *extra, nproc=None, timeout=150):
    """Run train_clip.py (under torchrun with nproc ranks, else in one process); returns each
    rank's per-step records ({"epoch", "step", "loss", "keys"}) and rank 0's summary."""
    script = [os.path.join(TOOLS, "train_clip.py"), "--output-dir", str(out), "--log-keys", str(out / "keys"), *extra]
    if nproc:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--master_addr=127.0.0.1",
               f"--master_port={_free_port()}", *script]
    else:
        cmd = [sys.executable, *script]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    steps = [[json.loads(line) for line in open(out / f"keys.rank{r}.jsonl")] for r in range(nproc or 1)]
    summary = json.load(open(out / "summary.json")) if os.path.exists(out / "summary.json") else None
    return steps, summary, result


def _keys(records, epoch=None):
    return [k for r in records if epoch is None or r["epoch"] == epoch for k in r["keys"]]


@pytest.fixture(scope="module")
def runs(clip_data, tmp_path_factory):
    """The uninterrupted two-rank run, and one stopped after 10 steps of its first epoch."""
    root = tmp_path_factory.mktemp("runs")
    data = ["--train-data", str(clip_data / "train-{000000..000003}.tar"), *COMMON]
    full = _train(root / "full", *data, "--val-data", str(clip_data / "eval-000000.tar"), nproc=2)
    stopped = _train(root / "stopped", *data, "--stop-at-step", "10", nproc=2)
    return {"data": data, "full": full, "stopped": root / "stopped", "stopped_steps": stopped[0]}


@pytest.mark.timeout(400)
@needs_torch
def test_two_ranks_learn(runs):
    steps, summary, _ = runs["full"]
    assert [len(s) for s in steps] == [48, 48]  # 2 epochs x 24 steps on each rank
    for epoch in (0, 1):  # the ranks split every epoch: each sample once
        keys = _keys(steps[0], epoch) + _keys(steps[1], epoch)
        assert len(keys) == len(set(keys)) == TRAIN
    losses = [r["loss"] for r in steps[0]]
    first, last = sum(losses[:8]) / 8, sum(losses[-8:]) / 8
    assert first > math.log(2 * BATCH) - 0.1  # starts at chance (global batch of 16)
    assert last < first - 0.3, losses
    assert summary["n"] == 64 and summary["image_to_text_top5"] > 5 / 64  # above chance, after 48 steps
    assert summary["samples_per_s"] > 0 and 0 <= summary["data_wait"] <= 1


@pytest.mark.timeout(400)
@needs_torch
def test_resume_on_two_ranks_sees_the_same_samples_and_losses(runs, tmp_path):
    out = tmp_path / "resumed"
    shutil.copytree(runs["stopped"], out)
    _, _, result = _train(out, *runs["data"], "--resume", "latest", nproc=2)
    assert "mid-epoch (saved on 2 ranks)" in result.stdout
    resumed = [[json.loads(line) for line in open(out / f"keys.rank{r}.jsonl")] for r in range(2)]
    full = runs["full"][0]
    for rank in range(2):
        assert [r["step"] for r in resumed[rank]] == list(range(1, 49))
        assert _keys(resumed[rank]) == _keys(full[rank])  # same samples, same order, both epochs
        assert [r["loss"] for r in resumed[rank]] == pytest.approx([r["loss"] for r in full[rank]], rel=1e-4)


@pytest.mark.timeout(400)
@needs_torch
def test_resume_on_one_rank_from_a_two_rank_checkpoint(runs, tmp_path):
    out = tmp_path / "elastic"
    shutil.copytree(runs["stopped"], out)
    _train(out, *runs["data"], "--resume", "latest", nproc=1)
    before = _keys(runs["stopped_steps"][0]) + _keys(runs["stopped_steps"][1])
    after = [json.loads(line) for line in open(out / "keys.rank0.jsonl")][10:]  # rank 0's first 10 steps were copied
    assert len(before) == 2 * 10 * BATCH
    epoch0 = before + _keys(after, 0)
    full = runs["full"][0]
    assert len(epoch0) == len(set(epoch0)) == TRAIN  # every sample of the epoch once, none twice
    assert set(epoch0) == set(_keys(full[0], 0) + _keys(full[1], 0))
    assert sorted(_keys(after, 1)) == sorted(set(epoch0))  # then a whole epoch on one rank


@pytest.mark.timeout(300)
@needs_torch
def test_resampled_weighted_sources_resume_exactly(clip_data, tmp_path):
    """Two `::` sources, OpenCLIP's upsampling factors, with_epoch, two DataLoader workers, one
    process: the run stopped at step 10 and resumed trains on the same samples."""
    data = ["--train-data", f"{clip_data}/train-{{000000..000003}}.tar::{clip_data}/extra-{{000000..000001}}.tar",
            "--dataset-resampled", "--train-data-upsampling-factors", "1::2", "--train-num-samples", "256",
            "--workers", "2", *COMMON]
    full, _, _ = _train(tmp_path / "full", *data)
    assert len(full[0]) == 2 * 256 // BATCH
    keys = _keys(full[0])
    extra = sum(k.startswith("extra-") for k in keys) / len(keys)
    assert 0.4 < extra < 0.75  # 200 samples x 2 against 384 x 1: about half (whole shards at a time)
    _train(tmp_path / "resumed", *data, "--stop-at-step", "10")
    resumed, _, _ = _train(tmp_path / "resumed", *data, "--resume", "latest")
    assert _keys(resumed[0]) == keys


@pytest.mark.timeout(300)
@needs_torch
def test_subprocess_loader_skips_bad_samples(tmp_path):
    _make(tmp_path / "data", "--train", "200", "--shard-size", "100", "--eval", "0", "--bad", "3")
    steps, _, result = _train(tmp_path / "run", "--train-data", str(tmp_path / "data" / "train-{000000..000001}.tar"),
                              "--subprocess-loader", *COMMON, "--epochs", "1")
    keys = _keys(steps[0])
    assert len(keys) == len(set(keys)) == (200 - 6) // BATCH * BATCH  # 3 truncated JPEGs, 3 without caption
    assert "DecodingError" in result.stderr


@pytest.mark.timeout(300)
@needs_torch
def test_http_shards_with_the_cache(clip_data, tmp_path):
    sys.path.insert(0, TOOLS)
    from shardserver import ShardServer

    with ShardServer(str(clip_data), latency_ms=5) as server:
        url = server.url() + "train-{000000..000003}.tar"  # (url() would quote the braces)
        steps, _, _ = _train(tmp_path / "run", "--train-data", url, "--cache-dir", str(tmp_path / "cache"),
                             *COMMON, nproc=None)
    assert len(_keys(steps[0], 0)) == TRAIN  # sizes.json read over HTTP: the whole epoch
    assert len([f for f in os.listdir(tmp_path / "cache") if f.endswith(".tar")]) == 4


@pytest.mark.timeout(300)
@needs_torch
def test_train_num_samples_ends_each_epoch_without_resampling(clip_data, tmp_path):
    """--train-num-samples 96 over 384 samples without --dataset-resampled sized only the learning
    rate schedule: each epoch trained all 384, three quarters of them at lr 0. Now each epoch
    ends at 96 (OpenCLIP's with_epoch does the same); more than the shards hold is refused."""
    data = ["--train-data", str(clip_data / "train-{000000..000003}.tar"), *COMMON]
    steps, summary, _ = _train(tmp_path / "run", *data, "--train-num-samples", "96")
    assert [len(_keys(steps[0], epoch)) for epoch in (0, 1)] == [96, 96]
    assert summary["samples_seen"] == 192
    cmd = [sys.executable, os.path.join(TOOLS, "train_clip.py"), "--output-dir", str(tmp_path / "no"), *data,
           "--train-num-samples", str(TRAIN + 1)]
    refused = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "more than the 384 samples" in refused.stderr


@pytest.mark.timeout(300)
@needs_torch
def test_the_subprocess_loader_s_resampled_epoch_is_not_divided_by_workers(clip_data, tmp_path):
    """--workers 2 with --subprocess-loader (one helper process, the flag unused) halved the
    resampled epoch: with_epoch's length was divided by the workers."""
    data = ["--train-data", str(clip_data / "train-{000000..000003}.tar"), "--dataset-resampled",
            "--train-num-samples", "192", *COMMON, "--epochs", "1"]
    steps, _, _ = _train(tmp_path / "run", *data, "--subprocess-loader", "--workers", "2")
    assert len(steps[0]) == 192 // BATCH


@pytest.mark.timeout(400)
@needs_torch
def test_a_resampled_run_resumed_on_fewer_ranks_trains_every_epoch(clip_data, tmp_path):
    """Saved on 2 ranks, resumed on 1: each epoch was taken to end at (epoch + 1) x
    --train-num-samples, but a resampled epoch is whole batches per worker (224, not 200): by a
    late epoch the run was past that, and the resumed epochs trained nothing."""
    data = ["--train-data", str(clip_data / "train-{000000..000003}.tar"), "--dataset-resampled",
            "--train-num-samples", "200", "--workers", "2", *COMMON, "--epochs", "4"]
    _train(tmp_path / "run", *data, "--stop-at-step", "24", nproc=2)  # 14 steps (224 samples) an epoch: in epoch 1
    steps, summary, result = _train(tmp_path / "run", *data, "--resume", "latest", nproc=None)
    assert "saved on 2 ranks" in result.stdout
    resumed = [r for r in steps[0] if r["step"] > 24]
    assert {r["epoch"] for r in resumed} == {1, 2, 3}
    rest = sum(r["epoch"] == 1 for r in resumed) * BATCH  # (one rank now)
    assert 24 * 2 * BATCH + rest >= 224 + 200  # epoch 1 was cut at (1 + 1) x 200 = 400: one step
    assert 4 * 200 <= summary["samples_seen"] <= 4 * 224
