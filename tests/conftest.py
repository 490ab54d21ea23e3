"""Shared fixtures: shard sets written once per session."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))  # shardserver

from shardsets import make_shardset  # noqa: E402


@pytest.fixture(scope="session")
def shardset(tmp_path_factory):
    """The differential shard set: a list of local shard paths."""
    return make_shardset(str(tmp_path_factory.mktemp("shardset")))


@pytest.fixture
def server(files):
    """A ShardServer over the requesting module's `files` fixture: (root, contents)."""
    from shardserver import ShardServer

    with ShardServer(files[0]) as srv:
        yield srv
