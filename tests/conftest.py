"""Shared fixtures: shard sets written once per session."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))  # shardserver

from needs import HAVE_TORCH, PARTIAL  # noqa: E402
from shardsets import make_shardset  # noqa: E402


def pytest_configure(config):
    if not HAVE_TORCH and not PARTIAL:
        raise pytest.UsageError(
            "torch is not installed: the full suite needs it (make test installs it). "
            "Set SHARDSTREAM_TEST_PARTIAL=1 to run without it, skipping the tests that need it.")


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
