"""Manifests for `create` (CSV, TSV, JSONL, JSON, Parquet; local or remote): rows img2dataset-style."""

from __future__ import annotations

import csv
import io
import json
import math
import os
from typing import Any, Dict, List, Optional, Tuple, Union
from urllib.parse import urljoin

from .._base.errors import UsageError
from .._fetch.open import local_path_of
from .._base.redact import redact
from .._shard.origin import open_origin
from .._plan.urls import shard_name
from ._options import CreateOptions
from ._rows import IMAGE_SUFFIXES, Listing, Ref, Row, safe_key

__all__ = ["MANIFEST_SUFFIXES", "read_manifest"]

MANIFEST_SUFFIXES = (".csv", ".tsv", ".jsonl", ".ndjson", ".json", ".parquet")
URL_COLUMNS = ("url", "path", "image", "image_path", "image_url", "file", "filepath", "filename")
CAPTION_COLUMNS = ("caption", "text", "txt")
LABEL_COLUMNS = ("label", "cls", "class")


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
            rows = []
            for number, line in enumerate(text.splitlines(), 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except ValueError as exn:
                        raise UsageError(f"cannot read manifest {redact(url)}: line {number}: {exn}") from None
                    if not isinstance(rows[-1], dict):
                        raise UsageError(f"manifest {redact(url)} line {number}: want a JSON object (one per sample), "
                                         f"got {type(rows[-1]).__name__}")
            return rows
        if name.endswith(".json"):
            loaded = json.loads(text)
            if not isinstance(loaded, list) or not all(isinstance(row, dict) for row in loaded):
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
    if isinstance(value, str) and ("." in value or "e" in value.lower()):
        try:  # a CSV's "1.0" (pandas writes an int column with gaps as floats): 1, as from JSONL
            number = float(value)
        except ValueError:
            number = None
        if number is not None and number.is_integer():
            value = int(number)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value).encode()


def _manifest_key(value: Any, number: int) -> str:
    """A key column's value as a sample key: member names stay relative ("/abs" is "abs", "dir/"
    is "dir"), and a key that names no file ("", "..", "a/../b") is refused."""
    parts = [part for part in str(value).strip().split("/") if part]
    if not parts or any(part in (".", "..") for part in parts):
        raise UsageError(f"manifest row {number}: the key {str(value)!r} names no file inside a shard")
    return safe_key("/".join(parts))


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
        given = record.get(key_col) if key_col else None
        key = f"{number:09d}" if _missing(given) else _manifest_key(given, number)
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
