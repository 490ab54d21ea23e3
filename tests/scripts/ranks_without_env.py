"""One rank of a group started without RANK/WORLD_SIZE (as srun or mp.spawn start ranks):
init_process_group(rank=, world_size=) over a file store, then one epoch through a WebLoader whose
worker is started by `spawn`; writes the keys it read to <out>/rank<r>.json.

usage: ranks_without_env.py RANK WORLD OUT START_METHOD SHARD...
"""

import json
import os
import sys

import torch.distributed as dist

import shardstream as wds

if __name__ == "__main__":
    rank, world, out, start = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method=f"file://{out}/store", rank=rank, world_size=world)
    dataset = wds.WebDataset(sys.argv[5:], shardshuffle=False, nodesplitter=wds.split_by_node).to_tuple("__key__")
    loader = wds.WebLoader(dataset, batch_size=None, num_workers=1, multiprocessing_context=start)
    keys = [key for (key,) in loader]
    with open(os.path.join(out, f"rank{rank}.json"), "w") as stream:
        json.dump(keys, stream)
    dist.destroy_process_group()
