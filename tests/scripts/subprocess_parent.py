"""A parent that starts a SubprocessLoader and then ends without closing it: `kill` waits to be
SIGKILLed, `exit` leaves the interpreter mid-iteration. Prints the helper's pid and segment prefix.

Usage: subprocess_parent.py kill|exit SHARD...
"""

import json
import sys
import time

import shardstream as wds


def main() -> None:
    mode, shards = sys.argv[1], sys.argv[2:]
    dataset = wds.WebDataset(shards, shardshuffle=False).decode().to_tuple("npy", "__key__").batched(1)
    it = iter(wds.SubprocessLoader(dataset, buffer=2))
    next(it)
    time.sleep(0.5)  # the helper fills its buffer: segments exist that this process never takes
    print(json.dumps({"pid": it.pid, "prefix": it._link.prefix}), flush=True)
    if mode == "kill":
        time.sleep(60)  # the test kills us
    sys.exit(0)  # mid-iteration, the iterator never closed


if __name__ == "__main__":
    main()
