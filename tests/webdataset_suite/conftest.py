"""Run webdataset 1.0.2's own tests with `import webdataset` pointing at shardstream.

This folder only runs in its own pytest process, started by tests/test_webdataset_suite.py with
SHARDSTREAM_WDS_SUITE=1. In any other session (`pytest tests`, which imports the real
webdataset for the differential tests) this conftest ignores every file here and changes
nothing, so the alias never leaks into other test modules.

In the suite's process it:
- installs shardstream as `webdataset` (and `webdataset.<module>`) before any test module loads;
- enables `pipe:` URLs and unpickling, which are webdataset's defaults and shardstream's
  opt-ins (README divergence table), since the tests exercise them;
- writes the stand-in data (standins.py) to a temp folder, serves it from 127.0.0.1, chdirs
  there (the tests read `testdata/...` relative to the working directory) and points the
  `remote_*` names the tests import from `tests.conftest` at the local server;
- refuses to resolve any host but the loopback one, so nothing reaches the network;
- provides `imageio.v3.imread` through Pillow when imageio is not installed;
- skips, with the reason, the tests listed in SKIPS.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import sys
import tempfile
import types

import pytest

ACTIVE = os.environ.get("SHARDSTREAM_WDS_SUITE") == "1"

if not ACTIVE:
    collect_ignore_glob = ["*.py"]
    # pytest put this folder first on sys.path to import this file; take it off again, or its
    # test_decode.py, test_writer.py, ... would shadow ours for the rest of the session.
    _HERE = os.path.dirname(os.path.abspath(__file__))
    while _HERE in sys.path:
        sys.path.remove(_HERE)
else:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))  # shardserver
    import numpy as np

    import shardstream
    from shardserver import ShardServer
    from standins import make_standins

    shardstream.install_as_webdataset()
    shardstream.allow_pipe(True)
    shardstream.allow_pickle(True)

    _ROOT = tempfile.mkdtemp(prefix="wds-suite-")
    atexit.register(shutil.rmtree, _ROOT, True)
    make_standins(_ROOT)
    _SERVER = ShardServer(_ROOT).__enter__()
    atexit.register(_SERVER.__exit__, None, None, None)

    # What the suite imports from `tests.conftest` (webdataset keeps these in its own conftest).
    local_data = "testdata/imagenet-000000.tgz"
    compressed = "testdata/compressed.tar"
    remote_loc = _SERVER.url("webdataset/openimages/")
    remote_shards = "openimages-train-0000{00..99}.tar"
    remote_shard = "openimages-train-000321.tar"
    remote_pattern = "openimages-train-{}.tar"
    remote_sample = _SERVER.url("webdataset/testdata/sample.tgz")

    def count_samples_tuple(source, *predicates, n=10000):
        """How many of the first `n` items of `source` there are; each must be a tuple, dict or
        list and satisfy every predicate."""
        count = 0
        for item in source:
            if count >= n:
                break
            assert isinstance(item, (tuple, dict, list)), (type(item), item)
            assert all(predicate(item) for predicate in predicates), item
            count += 1
        return count

    _tests = types.ModuleType("tests")
    _tests.__path__ = []
    _tests.conftest = sys.modules[__name__]
    sys.modules["tests"] = _tests
    sys.modules["tests.conftest"] = sys.modules[__name__]

    try:
        import imageio.v3  # noqa: F401
    except ImportError:
        _imageio, _v3 = types.ModuleType("imageio"), types.ModuleType("imageio.v3")

        def imread(uri, **kw):
            from PIL import Image

            return np.asarray(Image.open(uri))

        _v3.imread = imread
        _imageio.v3 = _v3
        sys.modules["imageio"], sys.modules["imageio.v3"] = _imageio, _v3

    _getaddrinfo = socket.getaddrinfo
    _LOOPBACK = {"127.0.0.1", "localhost", "::1", None}

    def _loopback_only(host, *args, **kw):
        name = host.decode() if isinstance(host, bytes) else host
        if name not in _LOOPBACK:
            raise socket.gaierror(socket.EAI_NONAME, f"the webdataset suite does not use the network ({name})")
        return _getaddrinfo(host, *args, **kw)

    socket.getaddrinfo = _loopback_only


def _missing(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return True
    return False


NETWORK = "reads a hard-coded remote URL (storage.googleapis.com / httpbin.org); no network here"

# test node id (relative to this folder) -> reason
SKIPS = {
    "test_cache.py::TestStreamingOpen::test_remote_file": NETWORK,
    "test_cache.py::TestFileCache::test_remote_file": NETWORK,
    "test_handlers.py::test_missing_throws2": NETWORK,
    "test_security.py::TestEnforceSecurity::test_safe_urls_still_work_when_security_enabled": NETWORK,
    "test_compat.py::test_dataset_eof": (
        "deliberate divergence (README): a truncated shard raises shardstream's FormatError "
        "(a ValueError naming URL, member and offset), not tarfile.ReadError"
    ),
    "test_pipeline.py::test_dataset_eof": (
        "deliberate divergence (README): a truncated shard raises shardstream's FormatError "
        "(a ValueError naming URL, member and offset), not tarfile.ReadError"
    ),
}
if _missing("lmdb"):
    SKIPS["test_compat.py::test_lmdb_cached"] = "needs the lmdb package, which the test environment does not install"
if _missing("torchvision"):
    for _name in ("test_compat.py", "test_pipeline.py"):
        for _test in ("test_torchvision", "test_batched", "test_unbatched"):
            SKIPS[f"{_name}::{_test}"] = "needs torchvision, which the test environment does not install"


def pytest_configure(config):
    config.addinivalue_line("markers", "quick: webdataset's marker for quick tests")
    config.addinivalue_line("markers", "notorch: webdataset's marker for tests without torch")


def pytest_collection_modifyitems(config, items):
    if not ACTIVE:
        return
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        node = os.path.relpath(str(item.path), here) + "::" + "::".join(item.nodeid.split("::")[1:])
        reason = SKIPS.get(node)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session", autouse=True)
def _in_the_standin_folder():
    """The tests open `testdata/...` relative to the working directory."""
    if not ACTIVE:
        yield
        return
    previous = os.getcwd()
    os.chdir(_ROOT)
    try:
        yield
    finally:
        os.chdir(previous)
