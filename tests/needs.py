"""What a test needs that a partial run may lack (the suite on other Pythons runs without torch:
`make test-pythons`), and the markers that skip it there.

A full run (`make test`) has everything: `conftest.py` stops it at once when torch is missing,
unless SHARDSTREAM_TEST_PARTIAL is set, so these markers never hide a broken install there."""

from __future__ import annotations

import importlib
import importlib.util
import os
from types import ModuleType
from typing import Optional

import pytest

PARTIAL = os.environ.get("SHARDSTREAM_TEST_PARTIAL", "") not in ("", "0")
HAVE_TORCH = importlib.util.find_spec("torch") is not None

needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed (a partial run)")


def optional(name: str) -> Optional[ModuleType]:
    """The module, or None where it is not installed (tests that use it are marked to skip)."""
    return importlib.import_module(name) if importlib.util.find_spec(name) is not None else None


def torch_attr(name: str):
    """`torch.<name>` for a test's parameters (a dtype, a type), or the name where torch is not
    installed: the parameters that use it are marked `needs_torch`, so they never run there."""
    torch = optional("torch")
    return getattr(torch, name) if torch is not None else f"torch.{name}"
