"""One shard's bytes to samples: routing a URL to fetch/cache, members, indexes, counts (see README.md in this folder)."""
