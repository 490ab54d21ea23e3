"""Keeping shard bytes close: memory and node-shared disk tiers, stream-through, integrity (see README.md in this folder)."""
