"""Unmodified webdataset scripts run on shardstream: `python -m shardstream.run` and the shim."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import webdataset

import shardstream
from needs import needs_torch

HERE = os.path.dirname(__file__)


def _run(args, **kw):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, **kw)


def test_openclip_style_script_gives_the_same_batches(shardset):
    script = os.path.join(HERE, "scripts", "openclip_style.py")
    ours = _run(["-m", "shardstream.run", script, *shardset])
    assert ours.returncode == 0, ours.stderr
    # The reference: the same script on webdataset 1.0.2 itself. Its tar_file_expander yields an
    # end-of-shard marker `{}` that OpenCLIP's grouper cannot handle (KeyError 'fname'), which is
    # exactly the 0.2.x behaviour shardstream keeps; so compare against 1.0.2 with the marker off.
    reference = _run(["-c", _REFERENCE + _NO_EOF_MARKER + _RUN, script, *shardset])
    assert reference.returncode == 0, reference.stderr
    ours_batches = [json.loads(line) for line in ours.stdout.splitlines()]
    ref_batches = [json.loads(line) for line in reference.stdout.splitlines()]
    assert len(ours_batches) >= 3
    assert ours_batches == ref_batches


# webdataset 1.0.2 with the two 0.2.x behaviours OpenCLIP needs patched back in.
_REFERENCE = """
import functools, runpy, sys
import webdataset.shardlists as s
_expand = s.expand_urls
s.expand_urls = lambda urls: _expand(urls) if isinstance(urls, str) else list(urls)
"""
_NO_EOF_MARKER = """
import webdataset.tariterators as t
t.tar_file_expander = functools.partial(t.tar_file_expander, eof_value=None)
"""
_RUN = """
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_webdataset_1_0_2_breaks_on_openclip_grouper(shardset):
    # Documents why tar_file_expander has no end-of-shard marker by default.
    script = os.path.join(HERE, "scripts", "openclip_style.py")
    result = _run(["-c", _REFERENCE + _RUN, script, *shardset])
    assert result.returncode != 0 and "KeyError: 'fname'" in result.stderr, result.stderr
    result = _run([script, *shardset])
    assert result.returncode != 0 and "AttributeError" in result.stderr, result.stderr


def test_shim_maps_every_submodule():
    code = (
        "import shardstream, sys; shardstream.install_as_webdataset();"
        "import webdataset, webdataset.tariterators as t, webdataset.filters as f, webdataset.shardlists as s;"
        "assert webdataset is shardstream and t is shardstream.tariterators and f._shuffle and s.expand_urls;"
        "from webdataset.autodecode import imagehandler; from webdataset.utils import pytorch_worker_info;"
        "from webdataset.writer import ShardWriter; from webdataset.pytorch import IterableDataset;"
        "print('ok')"
    )
    result = _run(["-c", code])
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_run_passes_arguments_and_exit_status(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("import sys, webdataset; print(webdataset.__name__, sys.argv[1:]); sys.exit(3)")
    result = _run(["-m", "shardstream.run", str(script), "a", "b"])
    assert result.returncode == 3
    assert result.stdout.strip() == "shardstream ['a', 'b']"


def test_expand_urls_accepts_lists_like_0_2():
    assert shardstream.shardlists.expand_urls(["a.tar", "b.tar"]) == ["a.tar", "b.tar"]
    assert shardstream.shardlists.expand_urls("a-{0..2}.tar::b.tar") == ["a-0.tar", "a-1.tar", "a-2.tar", "b.tar"]
    assert webdataset.shardlists.expand_urls("a-{0..1}.tar") == shardstream.shardlists.expand_urls("a-{0..1}.tar")


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
@needs_torch
def test_workers_started_by_spawn_or_forkserver_run_the_script_on_shardstream_too(shardset, context):
    """Such workers import the script again (`import webdataset`) before they unpickle the
    pipeline, and had the real webdataset: OpenCLIP's pipeline then met 1.0.2's end-of-shard `{}`
    (KeyError 'fname') in every worker, or failed to import where webdataset is not installed.
    forkserver is the default start method from Python 3.14; spawn is macOS's."""
    from shardstream.tariterators import tar_file_expander, url_opener

    script = os.path.join(HERE, "scripts", "spawn_workers.py")
    result = _run(["-m", "shardstream.run", script, context, *shardset])
    assert result.returncode == 0, result.stderr[-3000:]
    expected = sum(1 for _ in tar_file_expander(url_opener({"url": url} for url in shardset)))
    assert json.loads(result.stdout) == {"libraries": ["shardstream"], "members": expected}
