"""Which shards, in which order, for each (seed, epoch, rank, worker): pure, no I/O (see README.md in this folder)."""
