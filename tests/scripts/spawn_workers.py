"""OpenCLIP's way of reading shards (`url_opener` + `tar_file_expander` and a grouper of its own,
imported from `webdataset` at the top), in torch DataLoader workers started by the start method
given first (spawn, forkserver). Run it through `python -m shardstream.run`; it prints which
library the workers' `webdataset` was and how many members they read.
"""

import json
import sys

import webdataset as wds
from webdataset.tariterators import tar_file_expander, url_opener


def members(src):
    for member in tar_file_expander(url_opener(src)):  # (webdataset 1.0.2 ends a shard with {}: KeyError)
        yield {"name": member["fname"], "library": wds.__name__}


def main():
    import torch

    pipeline = wds.DataPipeline(wds.SimpleShardList(sys.argv[2:]), wds.split_by_worker, members)
    loader = torch.utils.data.DataLoader(pipeline, batch_size=None, num_workers=2, multiprocessing_context=sys.argv[1])
    read = list(loader)
    print(json.dumps({"libraries": sorted({m["library"] for m in read}), "members": len(read)}))


if __name__ == "__main__":
    main()
