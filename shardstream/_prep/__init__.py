"""Shard preparation (`shardstream create`): sources, plan, writer, engines. See README.md here."""

from ._create import CreateSummary, create_shards
from ._options import CreateOptions

__all__ = ["CreateOptions", "CreateSummary", "create_shards"]
