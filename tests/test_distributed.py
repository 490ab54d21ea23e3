"""A real distributed run: torchrun --nproc_per_node=2, gloo on CPU, two DataLoader workers per
rank, seven shards of 5 to 40 samples, an all_reduce every step. Both ranks finish with equal
batch counts and disjoint samples; a run resumed from a mid-epoch checkpoint completes the epoch
exactly."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
from shardsets import sample_members, write_tar
from needs import needs_torch

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "ddp_equal.py")
SIZES = [5, 40, 12, 23, 8, 31, 17]


@pytest.fixture(scope="module")
def uneven_shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("uneven")
    shards, index = [], 0
    for n, size in enumerate(SIZES):
        members = [m for i in range(index, index + size) for m in sample_members(i, exts=("cls", "txt"))]
        shards.append(write_tar(str(root / f"part-{n}.tar"), members))
        index += size
    return shards


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(out, shards, *extra, nproc=2):
    os.makedirs(out, exist_ok=True)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--master_addr=127.0.0.1",
        f"--master_port={_free_port()}", SCRIPT, str(out), *shards, *extra,
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(nproc)]


@pytest.mark.timeout(300)
@needs_torch
def test_ranks_get_equal_batches_and_disjoint_samples(uneven_shards, tmp_path):
    ranks = _torchrun(tmp_path / "full", uneven_shards)
    assert ranks[0]["batches"] == ranks[1]["batches"] > 0
    a, b = set(ranks[0]["keys"]), set(ranks[1]["keys"])
    assert len(a) == len(ranks[0]["keys"]) and len(b) == len(ranks[1]["keys"])
    assert not a & b
    assert len(a) == len(b) == sum(SIZES) // 2  # 136 samples divide evenly: nothing dropped
    # A new epoch gets a new shard order, the same on both ranks and again equal.
    epoch1 = _torchrun(tmp_path / "epoch1", uneven_shards, "--epoch", "1")
    assert epoch1[0]["batches"] == epoch1[1]["batches"]
    assert set(epoch1[0]["keys"]) | set(epoch1[1]["keys"]) == a | b
    assert epoch1[0]["keys"] != ranks[0]["keys"]


@pytest.mark.timeout(300)
@needs_torch
def test_resume_mid_epoch_completes_the_epoch_exactly(uneven_shards, tmp_path):
    full = _torchrun(tmp_path / "full", uneven_shards)
    first = _torchrun(tmp_path / "first", uneven_shards, "--stop-after", "5")
    states = {str(r["rank"]): r["state"] for r in first}
    state_file = tmp_path / "state.json"
    state_file.write_text(json.dumps(states))
    rest = _torchrun(tmp_path / "rest", uneven_shards, "--resume", str(state_file))
    for rank in range(2):
        assert first[rank]["keys"] + rest[rank]["keys"] == full[rank]["keys"]
    assert first[0]["batches"] + rest[0]["batches"] == first[1]["batches"] + rest[1]["batches"]


@pytest.mark.timeout(300)
@needs_torch
def test_elastic_resume_on_fewer_ranks(uneven_shards, tmp_path):
    """Checkpoint 2 ranks mid-epoch (states gathered over gloo), finish the epoch on 1 rank:
    every sample of the epoch exactly once (136 divides by 2 and by 1: nothing dropped)."""
    first = _torchrun(tmp_path / "first", uneven_shards, "--stop-after", "5", "--elastic")
    assert first[0]["state"] == first[1]["state"] and len(first[0]["state"]) == 2
    state_file = tmp_path / "state.json"
    state_file.write_text(json.dumps(first[0]["state"]))
    rest = _torchrun(tmp_path / "rest", uneven_shards, "--resume", str(state_file), "--elastic", nproc=1)
    keys = first[0]["keys"] + first[1]["keys"] + rest[0]["keys"]
    assert len(keys) == len(set(keys)) == sum(SIZES)


@pytest.mark.timeout(400)
@needs_torch
def test_chained_elastic_resumes_share_one_history(uneven_shards, tmp_path):
    """2 ranks -> 1 -> 2 -> 1 in one epoch, states gathered over gloo and saved as JSON each
    time: every sample once, and the gathered states of a resumed run share the history they
    resumed from (it was one copy per rank, nested per resume: O(ranks^2) at 1024 -> 768)."""
    state, keys = None, []
    for step, (nproc, stop) in enumerate([(2, 3), (1, 2), (2, 1), (1, None)]):
        extra = ["--elastic"] + (["--stop-after", str(stop)] if stop else [])
        if state is not None:
            (tmp_path / f"state{step}.json").write_text(json.dumps(state))
            extra += ["--resume", str(tmp_path / f"state{step}.json")]
        ranks = _torchrun(tmp_path / f"run{step}", uneven_shards, *extra, nproc=nproc)
        keys += [k for r in ranks for k in r["keys"]]
        if stop:
            state = ranks[0]["state"]
            assert len(state) == nproc and ranks[0]["state"] == ranks[-1]["state"]
        if step == 2:  # two ranks of a resumed run: one history between them
            assert ranks[0]["shared_split"] and ranks[0]["all_pickled"] < 1.3 * ranks[0]["one_pickled"]
    assert len(keys) == len(set(keys)) == sum(SIZES)  # (what is left divides evenly at every step)


@pytest.mark.timeout(300)
@needs_torch
def test_subprocess_loader_per_rank(uneven_shards, tmp_path):
    """One helper process per rank (WebLoader(subprocess=True)): equal batch counts, disjoint
    samples, nothing dropped (its resume is the resume harness's, test_resume.py)."""
    full = _torchrun(tmp_path / "full", uneven_shards, "--subprocess")
    assert full[0]["batches"] == full[1]["batches"] > 0
    a, b = set(full[0]["keys"]), set(full[1]["keys"])
    assert not a & b and len(a) == len(b) == sum(SIZES) // 2


@pytest.mark.timeout(300)
@needs_torch
def test_ranks_started_without_env_split_in_spawned_workers(uneven_shards, tmp_path):
    """Ranks that know their place only from init_process_group (no RANK/WORLD_SIZE: srun,
    mp.spawn) hand it to DataLoader workers started by spawn, which unpickle the dataset outside
    the group (webdataset and we read every sample on every rank there)."""
    script = os.path.join(os.path.dirname(__file__), "scripts", "ranks_without_env.py")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    ranks = [subprocess.Popen([sys.executable, script, str(r), "2", str(tmp_path), "spawn", *uneven_shards],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    try:
        outputs = [rank.communicate(timeout=180)[0] for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()
    assert [rank.returncode for rank in ranks] == [0, 0], outputs
    first, second = [json.load(open(tmp_path / f"rank{r}.json")) for r in range(2)]
    assert len(first) == len(second) == sum(SIZES) // 2
    assert not set(first) & set(second)


def _gather_mixed(rank, port, out):
    import datetime

    import torch.distributed as dist

    import shardstream as wds

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=3, timeout=datetime.timedelta(seconds=30))
    old = [{"epoch": 0, "layout": {"rank": r, "world_size": 2, "num_workers": 1}, "split": None} for r in range(2)]
    split = {0: old, 1: old[:1], 2: None}[rank]  # (states of different runs: misuse, but no hang)
    got = wds.gather_states({"epoch": 0, "layout": {"rank": rank, "world_size": 3, "num_workers": 1}, "split": split})
    dist.barrier()
    with open(os.path.join(out, f"{rank}.json"), "w") as f:
        json.dump([s["split"] for s in got], f)
    dist.destroy_process_group()


@pytest.mark.timeout(120)
@needs_torch
def test_gather_states_of_ranks_with_different_histories_gives_them_whole(tmp_path):
    """Every rank takes the same branch after the first gather (it decides from the gathered
    list alone): a rank without a history used to skip the second gather the others waited in."""
    import torch.multiprocessing as mp

    mp.spawn(_gather_mixed, args=(_free_port(), str(tmp_path)), nprocs=3, join=True)
    old = [{"epoch": 0, "layout": {"rank": r, "world_size": 2, "num_workers": 1}, "split": None} for r in range(2)]
    for rank in range(3):
        assert json.loads((tmp_path / f"{rank}.json").read_text()) == [old, old[:1], None]
