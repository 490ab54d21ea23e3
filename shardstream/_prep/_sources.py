"""What `create` packs: an image folder, a manifest (CSV, TSV, JSONL, JSON, Parquet) or shards,
listed into rows, one per sample, in a deterministic order.

A row names where each field's bytes come from (a file or URL, read later by the writer) or
holds them (captions, labels, metadata); resharding rows point at a sample of a source shard.
Listing reads no image: folders are walked (sizes come from `stat` when `--maxsize` needs them),
manifests are read whole, source shards are counted (sizes.json / .idx / header walk, else read).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, NamedTuple, Optional, Tuple, Union
from urllib.parse import urljoin

from .._errors import UsageError
from .._keys import base_plus_ext
from .._open import local_path_of
from .._redact import redact
from .._samples import open_origin
from .._urls import expand_urls, shard_name
from ._options import SHARD_SUFFIXES, CreateOptions

__all__ = ["Listing", "Ref", "Row", "detect_input", "list_source", "shard_files"]

MANIFEST_SUFFIXES = (".csv", ".tsv", ".jsonl", ".ndjson", ".json", ".parquet")
IMAGE_SUFFIXES = frozenset("jpg jpeg png webp bmp gif tif tiff ppm pgm pbm pnm".split())
URL_COLUMNS = ("url", "path", "image", "image_path", "image_url", "file", "filepath", "filename")
CAPTION_COLUMNS = ("caption", "text", "txt")
LABEL_COLUMNS = ("label", "cls", "class")
_UNSAFE_KEY = re.compile(r"[.\s]")


class Ref(NamedTuple):
    """A field whose bytes are read, when the shard is written, from a path or URL."""

    url: str


class Row(NamedTuple):
    """One planned sample. `key` None: the source sample's own key (resharding). `size`: input
    payload bytes, None where unknown (URLs). `origin`: (source shard number, sample number)."""

    key: Optional[str]
    fields: Tuple[Tuple[str, Union[bytes, Ref]], ...]
    size: Optional[int]
    origin: Optional[Tuple[int, int]] = None


@dataclass
class Listing:
    kind: str
    rows: List[Row]
    classes: Optional[Dict[str, int]] = None
    shard_urls: List[str] = field(default_factory=list)


def safe_key(text: str) -> str:
    """A sample key that every reader splits the same way: no dots (webdataset splits the
    extension at the first dot) and no whitespace (DALI's index is space-separated)."""
    return _UNSAFE_KEY.sub("_", text)


def _field_ext(ext: str, normalise: bool) -> str:
    ext = _UNSAFE_KEY.sub("_", ext.lower()) if normalise else re.sub(r"\s", "_", ext.lower())
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
    if "::" in source or "{" in source or name.endswith(SHARD_SUFFIXES):
        return "shards"
    if name.endswith(MANIFEST_SUFFIXES):
        return "manifest"
    raise UsageError(
        f"cannot tell what {redact(source)!r} is: give a directory, shards (.tar, a {{..}} spec) or a manifest "
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
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            if labels:
                stem, ext = os.path.splitext(rel)
                key, ext = safe_key(stem), _field_ext(ext[1:], True)
            else:
                key, ext = base_plus_ext(rel)
                if key is None:
                    continue
                key, ext = re.sub(r"\s", "_", key), _field_ext(ext, False)
            if not ext:
                continue
            fields = groups.setdefault(key, {})
            if ext in fields:
                raise UsageError(f"two files give sample {key!r} its field {ext!r}: {fields[ext]} and {full}")
            fields[ext] = full
    classes = None
    if labels:
        folders = sorted({key.split("/", 1)[0] for key in groups if "/" in key})
        classes = _read_classes(classes_file) if classes_file else {name: i for i, name in enumerate(folders)}
        unknown = [name for name in folders if name not in classes]
        if unknown:
            raise UsageError(f"class folders missing from --classes: {unknown[:5]}")
    rows = []
    for key in sorted(groups):
        fields_of = groups[key]
        row_fields: List[Tuple[str, Union[bytes, Ref]]] = [(ext, Ref(path)) for ext, path in sorted(fields_of.items())]
        size = sum(os.path.getsize(path) for path in fields_of.values()) if need_sizes else None
        if classes is not None and "/" in key:
            if "cls" in fields_of:
                raise UsageError(f"sample {key!r} has a .cls file and a class folder: use --input files")
            label = str(classes[key.split("/", 1)[0]]).encode()
            row_fields.append(("cls", label))
            size = None if size is None else size + len(label)
        rows.append(Row(key, tuple(sorted(row_fields)), size))
    if not rows:
        raise UsageError(f"no files under {root}")
    return Listing("imagefolder" if labels else "files", rows, classes)


# --- manifests -------------------------------------------------------------------------------

def _records(url: str) -> List[Dict[str, Any]]:
    name = shard_name(url).lower()
    data = b"".join(open_origin(url))
    try:
        if name.endswith(".parquet"):
            try:
                import pyarrow.parquet as pq
            except ImportError:
                raise UsageError("Parquet manifests need pyarrow: pip install pyarrow") from None
            return pq.read_table(io.BytesIO(data)).to_pylist()
        text = data.decode("utf-8-sig")
        if name.endswith((".jsonl", ".ndjson")):
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        if name.endswith(".json"):
            loaded = json.loads(text)
            if not isinstance(loaded, list):
                raise UsageError("a .json manifest holds a list of objects (one per sample)")
            return loaded
        return list(csv.DictReader(io.StringIO(text), delimiter="\t" if name.endswith(".tsv") else ","))
    except (ValueError, csv.Error) as exn:
        if isinstance(exn, UsageError):
            raise
        raise UsageError(f"cannot read manifest {redact(url)}: {exn}") from None


def _pick(wanted: Optional[str], defaults: Tuple[str, ...], columns: List[str], what: str) -> Optional[str]:
    if wanted is not None:
        if wanted not in columns:
            raise UsageError(f"the manifest has no column {wanted!r} for {what} (it has {columns})")
        return wanted
    return next((c for c in defaults if c in columns), None)


def _missing(value: Any) -> bool:
    return value is None or value == "" or (isinstance(value, float) and math.isnan(value))


def _resolve(src: str, manifest: str) -> str:
    if "://" in src or src.startswith("file:") or os.path.isabs(src):
        return src
    base = local_path_of(manifest)
    if base is not None:
        return os.path.join(os.path.dirname(os.path.abspath(base)), src)
    return urljoin(manifest.split("?", 1)[0], src)


def _image_ext(src: str) -> str:
    suffix = shard_name(src).rpartition(".")[2].lower()
    suffix = "jpg" if suffix == "jpeg" else suffix
    return suffix if suffix in IMAGE_SUFFIXES else "jpg"


def _label(value: Any) -> bytes:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value).encode()


def read_manifest(opts: CreateOptions, need_sizes: bool) -> Listing:
    """img2dataset-style rows: the url/path column becomes the image (jpg unless its name says
    png, webp, ...), the caption `txt`, the label `cls`, and `json` holds the key, the url
    (credentials redacted) and every other column. Relative paths are relative to the manifest."""
    records = _records(opts.source)
    if not records:
        raise UsageError(f"the manifest {redact(opts.source)} has no rows")
    columns = list(records[0].keys())
    url_col = _pick(opts.url_col, URL_COLUMNS, columns, "the image path or URL")
    if url_col is None:
        raise UsageError(f"the manifest has none of the columns {URL_COLUMNS}: name yours with --url-col")
    caption_col = _pick(opts.caption_col, CAPTION_COLUMNS, columns, "captions")
    label_col = _pick(opts.label_col, LABEL_COLUMNS, columns, "labels")
    key_col = _pick(opts.key_col, ("key",), columns, "keys")
    used = {url_col, caption_col, label_col, key_col}
    rows, seen = [], set()
    for number, record in enumerate(records):
        src = record.get(url_col)
        if _missing(src):
            raise UsageError(f"manifest row {number} has no {url_col!r}")
        src = str(src)
        key = safe_key(str(record[key_col])) if key_col and not _missing(record.get(key_col)) else f"{number:09d}"
        if key in seen:
            raise UsageError(f"manifest row {number}: key {key!r} appears twice")
        seen.add(key)
        resolved = _resolve(src, opts.source)
        fields: List[Tuple[str, Union[bytes, Ref]]] = [(_image_ext(src), Ref(resolved))]
        if caption_col and not _missing(record.get(caption_col)):
            fields.append(("txt", str(record[caption_col]).encode()))
        if label_col and not _missing(record.get(label_col)):
            fields.append(("cls", _label(record[label_col])))
        meta = {k: v for k, v in record.items() if k not in used}
        meta.update(key=key, url=redact(src))
        fields.append(("json", json.dumps(meta, sort_keys=True, ensure_ascii=False, default=str).encode()))
        size = None
        if need_sizes:
            path = local_path_of(resolved)
            if path is None:
                raise UsageError(
                    "--maxsize needs sample sizes before anything is downloaded: this manifest has URLs; use --maxcount"
                )
            size = os.path.getsize(path) + sum(len(v) for _, v in fields if isinstance(v, bytes))
        rows.append(Row(key, tuple(sorted(fields)), size))
    return Listing("manifest", rows)


# --- shards ----------------------------------------------------------------------------------

def _payload_sizes(url: str) -> List[int]:
    from .._samples import TarShardSamples

    return [sum(len(v) for k, v in s.items() if not k.startswith("__")) for s in TarShardSamples().run([url])]


def list_shards(source: str, need_sizes: bool = False, progress: bool = False) -> Listing:
    """One row per sample of the source shards (counted from sizes.json, .idx, a header walk,
    else by reading them; `need_sizes` reads them all for exact payload sizes)."""
    from .._counts import cheap_counts, read_counts
    from .._samples import TarShardSamples

    directory = _local_dir(source)
    urls = shard_files(directory) if directory is not None else expand_urls(source)
    if not urls:
        raise UsageError(f"no shards in {redact(source)}")
    if need_sizes:
        sizes = [_payload_sizes(url) for url in urls]
        counts = [len(s) for s in sizes]
    else:
        counts = cheap_counts(urls)
        unknown = [url for url, count in zip(urls, counts) if count is None]
        if unknown:
            found = dict(zip(unknown, read_counts(unknown, TarShardSamples().batches, threads=8, progress=progress)))
            counts = [found.get(url, count) for url, count in zip(urls, counts)]
    rows = [
        Row(None, (), sizes[s][i] if need_sizes else None, (s, i))
        for s, count in enumerate(counts)
        for i in range(count)  # type: ignore[arg-type]
    ]
    return Listing("shards", rows, shard_urls=urls)
