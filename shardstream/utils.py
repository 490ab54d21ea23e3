"""webdataset's `utils`: worker info and seeds, iteration helpers, PipelineStage."""

from __future__ import annotations

import fnmatch
import functools
import glob
import importlib
import itertools as itt
import os
import re
import sys
import types
import warnings
from typing import Any, Callable, Iterable, Iterator, Optional, Union

import braceexpand
import numpy as np

from ._base import security as _security
from ._plan.ranks import pytorch_worker_info, pytorch_worker_seed
from ._stages.contract import PipelineStage

__all__ = [
    "PipelineStage",
    "compute_sample_weights",
    "deprecated",
    "fnmatch_with_braces",
    "glob_with_braces",
    "guess_batchsize",
    "identity",
    "is_iterable",
    "lookup_sym",
    "make_seed",
    "obsolete",
    "pytorch_worker_info",
    "pytorch_worker_seed",
    "repeatedly",
    "repeatedly0",
    "safe_eval",
]



class _UtilsModule(types.ModuleType):
    """`utils.enforce_security` (webdataset's switch, WDS_SECURE=1) reads and sets the one flag in
    `_base.security`, so setting it here reaches gopen, pipes and the decoders."""

    enforce_security = property(lambda self: _security.enforced(), lambda self, value: _security.enforce(value))


sys.modules[__name__].__class__ = _UtilsModule


def glob_with_braces(pattern: str):
    return [f for pat in braceexpand.braceexpand(pattern) for f in glob.glob(pat)]


def fnmatch_with_braces(filename: str, pattern: str) -> bool:
    return any(fnmatch.fnmatch(filename, pat) for pat in braceexpand.braceexpand(pattern))


def make_seed(*args: Any) -> int:
    """webdataset's seed mixer (uses hash(); stable for ints, per-process for str)."""
    seed = 0
    for arg in args:
        seed = (seed * 31 + hash(arg)) & 0x7FFFFFFF
    return seed


def is_iterable(obj: Any) -> bool:
    if isinstance(obj, (str, bytes)):
        return False
    return isinstance(obj, (list, Iterable, Iterator))


def identity(x: Any) -> Any:
    return x


def safe_eval(s: str, expr: str = "{}"):
    if re.sub("[^A-Za-z0-9_]", "", s) != s:
        raise ValueError(f"safe_eval: illegal characters in: '{s}'")
    return eval(expr.format(s))


def lookup_sym(sym: str, modules: list):
    for mname in modules:
        module = importlib.import_module(mname, package="shardstream")
        result = getattr(module, sym, None)
        if result is not None:
            return result
    return None


def repeatedly0(loader: Iterator, nepochs: int = sys.maxsize, nbatches: int = sys.maxsize):
    for _ in range(nepochs):
        yield from itt.islice(loader, nbatches)


def guess_batchsize(batch: Union[tuple, list]) -> int:
    return len(batch[0])


def repeatedly(
    source: Iterable,
    nepochs: Optional[int] = None,
    nbatches: Optional[int] = None,
    nsamples: Optional[int] = None,
    batchsize: Callable[..., int] = guess_batchsize,
):
    """Iterate `source` again and again, up to nepochs / nbatches / nsamples; a pass that yields
    nothing ends it (webdataset's loops forever on an exhausted iterator)."""
    epoch = batch = total = 0
    while True:
        before = batch
        for sample in source:
            yield sample
            batch += 1
            if nbatches is not None and batch >= nbatches:
                return
            if nsamples is not None:
                total += guess_batchsize(sample)
                if total >= nsamples:
                    return
        epoch += 1
        if batch == before or (nepochs is not None and epoch >= nepochs):
            return


def deprecated(arg=None):
    func, reason = (arg, None) if callable(arg) else (None, arg)

    def decorator(func):
        @functools.wraps(func)
        def new_func(*args, **kwargs):
            msg = f"Call to deprecated function {func.__name__}."
            if reason is not None:
                msg += " Reason: " + reason
            warnings.warn(msg, category=DeprecationWarning, stacklevel=2)
            return func(*args, **kwargs)

        return new_func

    return decorator if func is None else decorator(func)


class ObsoleteException(Exception):
    pass


def obsolete(func=None, *, reason=None):
    if func is None:
        return functools.partial(obsolete, reason=reason)

    @functools.wraps(func)
    def new_func(*args, **kwargs):
        if not int(os.environ.get("ALLOW_OBSOLETE", "0")):
            msg = f"Call to obsolete function {func.__name__}. Set env ALLOW_OBSOLETE=1 to permit."
            if reason is not None:
                msg += " Reason: " + reason
            raise ObsoleteException(msg)
        return func(*args, **kwargs)

    return new_func


def compute_sample_weights(n_w_pairs):
    ns = np.array([p[0] for p in n_w_pairs])
    ws = np.array([p[1] for p in n_w_pairs])
    weighted = ns * ws
    return weighted / np.amax(weighted)
