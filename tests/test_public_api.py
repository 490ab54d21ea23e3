"""The public surface: every webdataset 1.0.2 name exists; __all__ lists are sorted and real."""

from __future__ import annotations

import ast
import importlib
import os

import webdataset

import shardstream


def test_every_webdataset_top_level_name_exists():
    names = [n for n in dir(webdataset) if not n.startswith("_")]
    # Submodules webdataset has that old code does not import by name.
    exempt = {"downloader", "multi", "pytorch", "typecheck", "extradatasets", "tenbin", "torch_dumps"}
    missing = [n for n in names if n not in exempt and not hasattr(shardstream, n)]
    assert missing == []


# The facade modules' names (webdataset.shardlists.X -> shardstream.shardlists.X): test_webdataset_names.py.


def _all_of(path):
    tree = ast.parse(open(path).read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return [elt.value for elt in node.value.elts]
    return None


def test_all_lists_are_sorted_and_resolve():
    package = os.path.dirname(shardstream.__file__)
    for name in sorted(os.listdir(package)):
        if not name.endswith(".py"):
            continue
        names = _all_of(os.path.join(package, name))
        if names is None:
            continue
        assert names == sorted(names), f"{name}: __all__ is not sorted"
        module = importlib.import_module(f"shardstream.{name[:-3]}" if name != "__init__.py" else "shardstream")
        assert [n for n in names if not hasattr(module, n)] == [], name


def test_py_typed_ships():
    assert os.path.exists(os.path.join(os.path.dirname(shardstream.__file__), "py.typed"))
