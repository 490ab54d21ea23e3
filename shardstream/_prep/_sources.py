"""What `create` packs: an image folder, a manifest (CSV, TSV, JSONL, JSON, Parquet) or shards,
listed into rows, one per sample, in a deterministic order.

A row names where each field's bytes come from (a file or URL, read later by the writer) or
holds them (captions, labels, metadata); resharding rows point at a sample of a source shard.
Listing reads no image: folders are walked (sizes come from `stat` when `--maxsize` needs them),
manifests are read whole, source shards are counted (sizes.json / .idx / header walk, else read).
"""

from __future__ import annotations

import json
import os
import re
from typing import Dict, List, Optional, Tuple, Union

from .._base.errors import UsageError
from .._tar.keys import base_plus_ext
from .._fetch.listing import expand_listings, needs_listing
from .._fetch.open import local_path_of
from .._base.redact import redact
from .._shard.origin import open_origin
from .._plan.urls import expand_urls, shard_name, split_sources
from ._manifest import MANIFEST_SUFFIXES, read_manifest
from ._options import SHARD_SUFFIXES, CreateOptions
from ._rows import UNSAFE_KEY, Listing, Ref, Row, safe_key

__all__ = ["Listing", "Ref", "Row", "detect_input", "list_source", "shard_files"]


def _field_ext(ext: str, normalise: bool) -> str:
    ext = UNSAFE_KEY.sub("_", ext.lower()) if normalise else re.sub(r"\s", "_", ext.lower())
    return "jpg" if ext == "jpeg" else ext


def _local_dir(source: str) -> Optional[str]:
    path = local_path_of(source)
    return path if path is not None and os.path.isdir(path) else None


def shard_files(directory: str) -> List[str]:
    names = sorted(n for n in os.listdir(directory) if not n.startswith("."))
    tars = [n for n in names if n.lower().endswith(SHARD_SUFFIXES)]
    rest = [n for n in names if n not in tars and n not in ("sizes.json", "classes.json") and not n.endswith(".idx")]
    return [os.path.join(directory, n) for n in tars] if tars and not rest else []


def detect_input(source: str) -> str:
    """imagefolder (a directory), shards (a spec, or a directory holding only shards) or
    manifest (.csv, .tsv, .jsonl, .json, .parquet)."""
    directory = _local_dir(source)
    if directory is not None:
        return "shards" if shard_files(directory) else "imagefolder"
    name = shard_name(source).lower()
    if name.endswith(MANIFEST_SUFFIXES):  # (first: `captions[v2].csv` is a manifest, not a glob)
        return "manifest"
    if len(split_sources(source)) > 1 or "{" in source or name.endswith(SHARD_SUFFIXES) or needs_listing(source):
        return "shards"  # (a glob, an s3:// prefix: listed as the loader lists them)
    raise UsageError(
        f"cannot tell what {redact(source)!r} is: give a directory, shards (.tar, a {{..}} spec, a glob, an "
        f"s3:// prefix) or a manifest "
        f"({', '.join(MANIFEST_SUFFIXES)}), or say --input"
    )


def list_source(opts: CreateOptions, progress: bool = False) -> Listing:
    """The rows of `opts.source`, in their deterministic input order."""
    kind = detect_input(opts.source) if opts.input == "auto" else opts.input
    need_sizes = opts.maxsize is not None
    if kind in ("imagefolder", "files"):
        directory = _local_dir(opts.source)
        if directory is None:
            raise UsageError(f"--input {kind} needs a local directory, not {redact(opts.source)!r}")
        return list_folder(directory, labels=kind == "imagefolder", classes_file=opts.classes, need_sizes=need_sizes)
    if kind == "manifest":
        return read_manifest(opts, need_sizes)
    return list_shards(opts.source, need_sizes, progress)


# --- folders ---------------------------------------------------------------------------------

def _read_classes(path: str) -> Dict[str, int]:
    try:
        given = json.loads(b"".join(open_origin(path)))
    except ValueError as exn:
        raise UsageError(f"--classes {redact(path)}: not JSON ({exn})") from None
    if isinstance(given, list):
        return {str(name): i for i, name in enumerate(given)}
    if isinstance(given, dict):
        return {str(name): int(index) for name, index in given.items()}
    raise UsageError("--classes must hold a JSON list of class names or an object {name: index}")


def list_folder(root: str, *, labels: bool, classes_file: Optional[str] = None, need_sizes: bool = False) -> Listing:
    """Files grouped into samples. `labels` (ImageFolder): the key is the path without its last
    suffix, the first folder is the class (`cls`, by `classes_file` or sorted folder names).
    Otherwise (the old `prepare`): webdataset's key rule, no labels. Hidden files are skipped."""
    groups: Dict[str, Dict[str, str]] = {}
    stems: Dict[str, str] = {}  # key -> the path (less its suffix) it came from: keys must not merge
    folder_of: Dict[str, str] = {}  # key -> its class folder, as named on disk
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):  # (linked class folders count)
        here = os.path.realpath(dirpath)
        kept = []
        for d in sorted(dirnames):
            real = os.path.realpath(os.path.join(dirpath, d))
            if not d.startswith(".") and not (here == real or here.startswith(real + os.sep)):  # (not a link loop)
                kept.append(d)
        dirnames[:] = kept
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            if labels:
                stem, suffix = os.path.splitext(rel)
                key, ext = safe_key(stem), _field_ext(suffix[1:], True)
                origin = stem
            else:
                base, extension = base_plus_ext(rel)
                if base is None or extension is None:
                    continue
                key, ext = re.sub(r"\s", "_", base), _field_ext(extension, False)
                origin = base
            if not ext:
                continue
            if stems.setdefault(key, origin) != origin:
                raise UsageError(f"{stems[key]!r} and {origin!r} both become sample key {key!r} (dots and whitespace "
                                 "in keys become _): rename one")
            if labels and "/" in rel:
                folder_of[key] = rel.split("/", 1)[0]
            fields = groups.setdefault(key, {})
            if ext in fields:
                raise UsageError(f"two files give sample {key!r} its field {ext!r}: {fields[ext]} and {full}")
            fields[ext] = full
    classes = None
    if labels:
        folders = sorted(set(folder_of.values()))  # the names on disk, not the keys' (dots kept)
        classes = _read_classes(classes_file) if classes_file else {name: i for i, name in enumerate(folders)}
        unknown = [name for name in folders if name not in classes]
        if unknown:
            raise UsageError(f"class folders missing from --classes: {unknown[:5]}")
    rows = []
    for key in sorted(groups):
        fields_of = groups[key]
        row_fields: List[Tuple[str, Union[bytes, Ref]]] = [(ext, Ref(path)) for ext, path in sorted(fields_of.items())]
        size = sum(os.path.getsize(path) for path in fields_of.values()) if need_sizes else None
        if classes is not None and key in folder_of:
            if "cls" in fields_of:
                raise UsageError(f"sample {key!r} has a .cls file and a class folder: use --input files")
            label = str(classes[folder_of[key]]).encode()
            row_fields.append(("cls", label))
            size = None if size is None else size + len(label)
        rows.append(Row(key, tuple(sorted(row_fields)), size))
    if not rows:
        raise UsageError(f"no files under {root}")
    return Listing("imagefolder" if labels else "files", rows, classes)


# --- shards ----------------------------------------------------------------------------------

def _payload_sizes(url: str) -> List[int]:
    from .._shard.samples import TarShardSamples

    return [sum(len(v) for k, v in s.items() if not k.startswith("__")) for s in TarShardSamples().run([url])]


def list_shards(source: str, need_sizes: bool = False, progress: bool = False) -> Listing:
    """One row per sample of the source shards (counted from sizes.json, .idx, a header walk,
    else by reading them; `need_sizes` reads them all for exact payload sizes)."""
    from .._shard.counts import cheap_counts, read_counts
    from .._shard.samples import TarShardSamples

    directory = _local_dir(source)
    urls = shard_files(directory) if directory is not None else expand_listings(expand_urls(source))
    if not urls:
        raise UsageError(f"no shards in {redact(source)}")
    sizes: List[List[int]] = []
    if need_sizes:
        sizes = [_payload_sizes(url) for url in urls]
        counts = [len(s) for s in sizes]
    else:
        known = cheap_counts(urls)
        unknown = [url for url, count in zip(urls, known) if count is None]
        found = dict(zip(unknown, read_counts(unknown, TarShardSamples().batches, threads=8, progress=progress)))
        counts = [found[url] if count is None else count for url, count in zip(urls, known)]
    rows = [
        Row(None, (), sizes[s][i] if need_sizes else None, (s, i))
        for s, count in enumerate(counts)
        for i in range(count)  # type: ignore[arg-type]
    ]
    return Listing("shards", rows, shard_urls=urls, shard_counts=list(counts))  # type: ignore[arg-type]
