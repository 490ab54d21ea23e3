"""Running stages: threads, bounded channels, the decode pool, ordering, stats (see README.md in this folder)."""
