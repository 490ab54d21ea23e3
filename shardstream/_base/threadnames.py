"""Names of the threads shardstream starts, where another layer needs to recognise them."""

__all__ = ["POOL_THREAD_PREFIX"]

# The engine's decode pool threads (`_engine/pool.py`); decoders may tune their own per-thread
# settings by it (the fused image path gives each one torch intra-op thread).
POOL_THREAD_PREFIX = "shardstream-pool"
