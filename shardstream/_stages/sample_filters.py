"""Per-sample stages with webdataset's semantics: map, map_dict, map_tuple, to_tuple, select,
rename, rename_keys, extract_keys, associate, decode.

Each is a `SampleStage`, so the engine can fuse a run of them into one task per sample.
"""

from __future__ import annotations

import re
from fnmatch import fnmatch
from typing import Any, Callable, Dict, Optional

from .contract import DROP, SampleStage
from .._base.handlers import reraise_exception

__all__ = [
    "Associate",
    "Decode",
    "ExtractKeys",
    "Map",
    "MapDict",
    "MapTuple",
    "Rename",
    "RenameKeys",
    "Select",
    "ToTuple",
    "getfirst",
    "identity",
    "parse_field_spec",
    "transform_with",
]

Handler = Callable[[BaseException], bool]


def identity(x: Any) -> Any:
    """Return x unchanged."""
    return x


def getfirst(a: Dict[str, Any], keys, default=None, missing_is_error: bool = True):
    """Return the value of the first of `keys` ("a;b;c" or a list) present in `a`."""
    if isinstance(keys, str):
        assert " " not in keys
        keys = keys.split(";")
    for k in keys:
        if k in a:
            return a[k]
    if missing_is_error:
        raise ValueError(f"didn't find {keys} in {list(a.keys())}")
    return default


def parse_field_spec(fields):
    """Parse "a;b c" into [["a", "b"], ["c"]]."""
    if isinstance(fields, str):
        fields = fields.split()
    return [field.split(";") for field in fields]


def transform_with(sample, transformers):
    """Apply transformers[i] to sample[i] (None means identity); return a list."""
    if transformers is None or len(transformers) == 0:
        return sample
    result = list(sample)
    assert len(transformers) <= len(sample)
    for i, f in enumerate(transformers):
        if f is not None:
            result[i] = f(sample[i])
    return result


class Map(SampleStage):
    """`f(sample)`; None drops the sample; a dict result keeps the input's `__key__`."""

    def __init__(self, f: Callable[[Any], Any], handler: Handler = reraise_exception) -> None:
        self.f = f
        self.handler = handler
        self.name = f"map({getattr(f, '__name__', type(f).__name__)})"

    def apply(self, sample):
        result = self.f(sample)
        if result is None:
            return DROP
        if isinstance(sample, dict) and isinstance(result, dict):
            result["__key__"] = sample.get("__key__")
        return result


class MapDict(SampleStage):
    """Replace sample[k] by f(sample[k]) for each k=f, in place (as webdataset does)."""

    name = "map_dict"

    def __init__(self, handler: Handler = reraise_exception, **kw: Callable[[Any], Any]) -> None:
        assert len(kw) > 0
        for key, f in kw.items():
            assert callable(f), (key, f)
        self.fs = kw
        self.handler = handler

    def apply(self, sample):
        assert isinstance(sample, dict)
        for k, f in self.fs.items():
            sample[k] = f(sample[k])
        return sample


class MapTuple(SampleStage):
    """Apply the i-th function to the i-th element of a tuple sample (None: identity)."""

    name = "map_tuple"

    def __init__(self, *args: Optional[Callable[[Any], Any]], handler: Handler = reraise_exception) -> None:
        self.fs = [f if f is not None else identity for f in args]
        for f in self.fs:
            assert callable(f), f
        self.handler = handler

    def apply(self, sample):
        assert isinstance(sample, (list, tuple))
        sample = list(sample)
        for i in range(min(len(self.fs), len(sample))):
            sample[i] = self.fs[i](sample[i])
        return tuple(sample)


class ToTuple(SampleStage):
    """Turn a dict sample into a tuple of fields ("jpg;png cls" style specs)."""

    name = "to_tuple"

    def __init__(self, *args: str, handler: Handler = reraise_exception, missing_is_error: bool = True,
                 none_is_error: Optional[bool] = None) -> None:
        if none_is_error is None:
            none_is_error = missing_is_error
        if len(args) == 1 and isinstance(args[0], str) and " " in args[0]:
            args = tuple(args[0].split())
        self.fields = [f.split(";") if isinstance(f, str) else f for f in args]
        self.spec = args
        self.handler = handler
        self.missing_is_error = missing_is_error
        self.none_is_error = none_is_error

    def apply(self, sample):
        result = tuple(getfirst(sample, f, missing_is_error=self.missing_is_error) for f in self.fields)
        if self.none_is_error and any(x is None for x in result):
            raise ValueError(f"to_tuple {self.spec} got {sample.keys()}")
        return result


class Select(SampleStage):
    """Keep the samples for which `predicate(sample)` is true."""

    name = "select"

    def __init__(self, predicate: Callable[[Any], bool], **kw: Any) -> None:
        self.predicate = predicate

    def apply(self, sample):
        return sample if self.predicate(sample) else DROP


class Rename(SampleStage):
    """Rename fields: rename(image="jpg;png", text="txt"); keep=False drops the others."""

    name = "rename"

    def __init__(self, handler: Handler = reraise_exception, keep: bool = True, **kw: Any) -> None:
        self.handler = handler
        self.keep = keep
        self.kw = kw
        self.replaced = {x for v in kw.values() for x in (v.split(";") if isinstance(v, str) else v)}

    def apply(self, sample):
        if not self.keep:
            return {k: getfirst(sample, v, missing_is_error=True) for k, v in self.kw.items()}
        result = {k: v for k, v in sample.items() if k not in self.replaced}
        result.update({k: getfirst(sample, v, missing_is_error=True) for k, v in self.kw.items()})
        return result


class RenameKeys(SampleStage):
    """Rename keys by fnmatch patterns on the file name part (webdataset's rename_keys)."""

    name = "rename_keys"

    def __init__(self, *args, keep_unselected: bool = False, must_match: bool = True,
                 duplicate_is_error: bool = True, **kw: str) -> None:
        self.renamings = [(pattern, output) for output, pattern in args]
        self.renamings += [(pattern, output) for output, pattern in kw.items()]
        self.keep_unselected = keep_unselected
        self.must_match = must_match
        self.duplicate_is_error = duplicate_is_error

    def apply(self, sample):
        new_sample = {}
        matched = {k: False for k, _ in self.renamings}
        for path, value in sample.items():
            fname = re.sub(".*/", "", path)
            new_name = None
            for pattern, name in self.renamings[::-1]:
                if fnmatch(fname.lower(), pattern):
                    matched[pattern] = True
                    new_name = name
                    break
            if new_name is None:
                if self.keep_unselected:
                    new_sample[path] = value
                continue
            if new_name in new_sample:
                if self.duplicate_is_error:
                    raise ValueError(f"Duplicate value in sample {sample.keys()} after rename.")
                continue
            new_sample[new_name] = value
        if self.must_match and not all(matched.values()):
            raise ValueError(f"Not all patterns ({matched}) matched sample keys ({sample.keys()}).")
        return new_sample


class ExtractKeys(SampleStage):
    """Return a tuple of the values whose keys match each pattern ("*.jpg;*.png")."""

    name = "extract_keys"

    def __init__(self, *patterns, duplicate_is_error: bool = True, ignore_missing: bool = False) -> None:
        self.patterns = [p.split(";") if isinstance(p, str) else p for p in patterns]
        self.duplicate_is_error = duplicate_is_error
        self.ignore_missing = ignore_missing

    def apply(self, sample):
        result = []
        for pattern in self.patterns:
            matches = [x for x in sample.keys() if any(fnmatch("." + x, p) or fnmatch(x, p) for p in pattern)]
            if len(matches) == 0:
                if self.ignore_missing:
                    continue
                raise ValueError(f"Cannot find {pattern} in sample keys {sample.keys()}.")
            if len(matches) > 1 and self.duplicate_is_error:
                raise ValueError(f"Multiple sample keys {sample.keys()} match {pattern}.")
            result.append(sample[matches[0]])
        return tuple(result)


class Associate(SampleStage):
    """Merge extra fields into each sample, from a dict or a function of `__key__`."""

    name = "associate"

    def __init__(self, associator, **kw: Any) -> None:
        self.associator = associator

    def apply(self, sample):
        if callable(self.associator):
            extra = self.associator(sample["__key__"])
        else:
            extra = self.associator.get(sample["__key__"], {})
        sample.update(extra)
        return sample


class Decode(SampleStage):
    """Decode a sample's fields with a Decoder (image specs as strings become imagehandlers)."""

    name = "decode"

    def __init__(self, *args, handler: Handler = reraise_exception, **kw: Any) -> None:
        from .._decode.decoder import Decoder, imagehandler

        handlers = [imagehandler(x) if isinstance(x, str) else x for x in args]
        self.decoder = Decoder(handlers, **kw)
        self.handler = handler

    def apply(self, sample):
        assert isinstance(sample, dict), sample
        return self.decoder(sample)
