"""Every name webdataset 1.0.2 defines in the modules old code imports exists in the same-named
shardstream module (`webdataset.shardlists.X` -> `shardstream.shardlists.X`), of the same kind.

What counts as a module's API (the rule `api_names` applies):
  a name that does not start with "_", is not a module object, and is either
  - bound by a top-level statement of the module's own source (def, class, assignment), or
  - imported from another webdataset module (the object's `__module__` starts with "webdataset").
  Names a module merely imported from the standard library, typing, numpy, torch, braceexpand,
  yaml, ... (not bound in its source, `__module__` outside webdataset) are not its API.
Private names that real code imports by name are listed in PRIVATE_USED (OpenCLIP imports
`filters._shuffle`; webdataset's own tests import the other `filters._...` generators).
Deliberate omissions go in OMISSIONS with the reason for each.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import types

import pytest
from needs import needs_torch

MODULES = [
    "autodecode", "cache", "compat", "extradatasets", "filters", "gopen", "handlers", "mix",
    "pipeline", "shardlists", "tariterators", "tenbin", "utils", "writer",
]

PRIVATE_USED = {
    "filters": [
        "_batched", "_extract_keys", "_map", "_rename_keys", "_rsample", "_select", "_shuffle",
        "_to_tuple", "_xdecode",
    ],
}

# module -> {name: reason}. Nothing is left out today; a stale entry (a name we do have, or one
# webdataset does not) fails the test below.
OMISSIONS: dict = {}

_VALUE_TYPES = (int, float, str, bytes, bool, list, tuple, dict, set, type(None))


def _bound_in_source(module: types.ModuleType) -> set:
    names = set()
    for node in ast.parse(inspect.getsource(module)).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


def api_names(module: types.ModuleType) -> list:
    """The module's API by the rule in this file's docstring."""
    bound = _bound_in_source(module)
    result = []
    for name, value in vars(module).items():
        if name.startswith("_") or isinstance(value, types.ModuleType):
            continue
        origin = None if isinstance(value, _VALUE_TYPES) else getattr(value, "__module__", None)
        if name in bound or (isinstance(origin, str) and origin.startswith("webdataset")):
            result.append(name)
    return sorted(result)


def _same_kind(theirs, ours) -> bool:
    """A class stays a class (code subclasses them and checks isinstance); a function may be any
    callable (shardstream's filters are stage classes where webdataset has curried functions); a
    value stays a non-callable value."""
    if isinstance(theirs, type):
        return isinstance(ours, type)
    return callable(theirs) == callable(ours)


@pytest.mark.parametrize("module", MODULES)
@needs_torch
def test_module_has_every_webdataset_name(module):
    theirs = importlib.import_module(f"webdataset.{module}")
    ours = importlib.import_module(f"shardstream.{module}")
    omitted = OMISSIONS.get(module, {})
    wanted = api_names(theirs) + PRIVATE_USED.get(module, [])
    missing = [n for n in wanted if n not in omitted and not hasattr(ours, n)]
    assert missing == [], f"shardstream.{module} lacks {missing}"
    wrong_kind = [n for n in wanted if n not in omitted and not _same_kind(getattr(theirs, n), getattr(ours, n))]
    assert wrong_kind == []


def test_omissions_are_real_and_explained():
    for module, names in OMISSIONS.items():
        theirs = importlib.import_module(f"webdataset.{module}")
        ours = importlib.import_module(f"shardstream.{module}")
        for name, reason in names.items():
            assert name in api_names(theirs), f"{module}.{name} is not webdataset API"
            assert not hasattr(ours, name), f"{module}.{name} exists now: drop the omission"
            assert len(reason) > 20


@needs_torch
def test_the_rule_skips_imported_helpers_and_keeps_reexports():
    import webdataset.compat
    import webdataset.shardlists
    import webdataset.writer

    names = api_names(webdataset.shardlists)
    assert "List" not in names and "islice" not in names and "IterableDataset" not in names
    assert "obsolete" in names and "pipelinefilter" in names  # re-exported from webdataset modules
    assert "default_rng" in names  # a value bound in the source
    assert {"group_by_keys", "tar_file_expander"} <= set(api_names(webdataset.compat))
    assert "gopen" in api_names(webdataset.writer)


@needs_torch
def test_submodules_webdataset_reaches_as_attributes_are_here_too():
    """`import webdataset as wds; wds.tenbin.write(...)` works because webdataset's __init__
    imports them; here they load on first use."""
    import subprocess
    import sys

    code = ("import sys, shardstream as wds\n"
            "assert wds.tenbin.encode_buffer and wds.pytorch and 'torch' not in sys.modules\n"
            "import webdataset\n"
            "for name in ('tenbin', 'pytorch'):\n"
            "    assert hasattr(webdataset, name) and hasattr(wds, name), name\n"
            "import torch.utils.data, webdataset.pytorch as real\n"
            "assert wds.pytorch.DataLoader is real.DataLoader is torch.utils.data.DataLoader\n"
            "assert wds.pytorch.IterableDataset is real.IterableDataset is torch.utils.data.IterableDataset\n"
            "assert wds.pytorch.TorchTensor is real.TorchTensor is torch.Tensor\n"
            "from shardstream.pytorch import DataLoader\n"
            "assert DataLoader is torch.utils.data.DataLoader\n"
            )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def _keywords(fn) -> "tuple[list, bool] | None":
    """(names a caller may pass by keyword, whether it takes **kwargs), or None (no signature)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    names = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"]
    return names, any(p.kind == p.VAR_KEYWORD for p in params)


def _callables(module_name: str):
    """(name, webdataset's callable, ours) for the module's API functions, classes' __init__ and
    public methods."""
    theirs = importlib.import_module(f"webdataset.{module_name}")
    ours = importlib.import_module(f"shardstream.{module_name}")
    for name in api_names(theirs):
        their, our = getattr(theirs, name), getattr(ours, name, None)
        if our is None or not callable(their):
            continue
        if isinstance(their, type):
            yield f"{name}.__init__", their.__init__, getattr(our, "__init__", None)
            for method, value in vars(their).items():
                if not method.startswith("_") and callable(value) and hasattr(our, method):
                    yield f"{name}.{method}", value, getattr(our, method)
        else:
            yield name, their, our


@pytest.mark.parametrize("module", MODULES)
def test_webdataset_keyword_arguments_are_accepted(module):
    """Code that calls webdataset's functions with keyword arguments (`tenbin.encode_buffer(l=...)`,
    `envsubst(s=...)`) runs here too: our parameters keep webdataset's names. Left out: the stream
    parameter of webdataset's curried filters (`map(data, f)`: here stage classes take the stream
    when called)."""
    wrong = []
    for name, their, our in _callables(module):
        theirs, ours = _keywords(their), _keywords(our) if our is not None else None
        if theirs is None or ours is None or ours[1]:
            continue
        curried = type(their).__name__ == "RestCurried"
        missing = [k for i, k in enumerate(theirs[0]) if k not in ours[0] and not (curried and i == 0)]
        if missing:
            wrong.append(f"{module}.{name}: {missing}")
    assert wrong == []
