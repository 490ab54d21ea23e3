"""Install shardstream under the `webdataset` module names, so unmodified scripts run on it."""

from __future__ import annotations

import importlib
import os
import sys
from typing import List

__all__ = ["SHIM_PATH", "SUBMODULES", "install_as_webdataset"]

# A directory holding only a `webdataset` package that installs shardstream (see install_as_webdataset).
SHIM_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shimpath")

# webdataset submodule name -> shardstream module that provides it.
SUBMODULES = {
    "autodecode": "autodecode",
    "cache": "cache",
    "compat": "compat",
    "extradatasets": "extradatasets",
    "filters": "filters",
    "gopen": "gopen",
    "handlers": "handlers",
    "mix": "mix",
    "pipeline": "pipeline",
    "pytorch": "pytorch",
    "shardlists": "shardlists",
    "tariterators": "tariterators",
    "tenbin": "tenbin",
    "utils": "utils",
    "writer": "writer",
}


def install_as_webdataset(force: bool = False) -> List[str]:
    """Make `import webdataset` (and `webdataset.tariterators`, ...) return shardstream's modules.

    Raises RuntimeError if the real webdataset is already imported, unless force=True (then the
    already imported modules are replaced for later imports only). Returns the module names set.
    """
    if "webdataset" in sys.modules and not force:
        current = sys.modules["webdataset"]
        if getattr(current, "__name__", "") != "shardstream":
            raise RuntimeError("webdataset is already imported; call install_as_webdataset() before importing it")
    package = importlib.import_module("shardstream")
    installed = ["webdataset"]
    sys.modules["webdataset"] = package
    # Children started by spawn or forkserver (DataLoader workers; the default start method from
    # Python 3.14) get this process's sys.path, not its modules: there, `import webdataset`
    # finds the module in SHIM_PATH, which installs shardstream the same way.
    if SHIM_PATH not in sys.path:
        sys.path.insert(0, SHIM_PATH)
    for name, target in SUBMODULES.items():
        module = importlib.import_module(f"shardstream.{target}")
        sys.modules[f"webdataset.{name}"] = module
        if not hasattr(package, name):
            setattr(package, name, module)
        installed.append(f"webdataset.{name}")
    return installed
