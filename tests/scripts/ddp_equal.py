"""Run under `torchrun --nproc_per_node=2`: every rank reads its share of the shards through two
DataLoader workers and takes part in an all_reduce every step. Writes one JSON per rank.

Usage: ddp_equal.py OUT_DIR SHARD... [--stop-after N] [--resume STATE_JSON] [--elastic] [--subprocess]

--elastic: states gathered from all ranks with wds.gather_states, so the run can be resumed on
another number of ranks. --subprocess: each rank's loader runs in one helper process
(WebLoader(subprocess=True)) instead of two DataLoader workers.
"""

import argparse
import json
import os
import pickle
import warnings

import torch
import torch.distributed as dist

import shardstream as wds

warnings.filterwarnings("ignore")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("shards", nargs="+")
    parser.add_argument("--stop-after", type=int, default=None, help="checkpoint after this many batches")
    parser.add_argument("--resume", default=None, help="a state_dict written by a run with --stop-after")
    parser.add_argument("--epoch", type=int, default=0)
    parser.add_argument("--elastic", action="store_true")
    parser.add_argument("--subprocess", action="store_true", help="the loader in one helper process per rank")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dataset = (
        wds.WebDataset(args.shards, shardshuffle=True, seed=1234, nodesplitter=wds.split_by_node)
        .shuffle(16)  # seeded from (seed, epoch, rank, worker): a resume recomputes its buffer
        .to_tuple("__key__", "cls")
        .batched(4)
    )
    dataset.set_epoch(args.epoch)
    if args.subprocess:
        loader = wds.WebLoader(dataset, batch_size=None, subprocess=True)
    else:
        loader = wds.WebLoader(dataset, batch_size=None, num_workers=2)
    if args.resume:
        with open(args.resume) as f:
            saved = json.load(f)
        loader.load_state_dict(saved if isinstance(saved, list) else saved[str(rank)])
    keys, batches = [], 0
    for batch_keys, _labels in loader:
        total = torch.tensor([len(batch_keys)], dtype=torch.int64)
        dist.all_reduce(total)  # a collective every step: a rank with fewer batches would hang here
        keys.extend(batch_keys)
        batches += 1
        if args.stop_after is not None and batches == args.stop_after:
            break
    state = loader.state_dict() if args.stop_after is not None else None
    gathered = {}
    if state is not None and args.elastic:
        one = len(pickle.dumps(state))
        state = wds.gather_states(state)  # a collective: every rank's state, on every rank
        # after an elastic resume every state holds the same history: gathered, they share one
        gathered = {"one_pickled": one, "all_pickled": len(pickle.dumps(state)),
                    "shared_split": all(s["split"] is state[0]["split"] for s in state)}
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "world": world, "batches": batches, "keys": keys, "state": state, **gathered}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
