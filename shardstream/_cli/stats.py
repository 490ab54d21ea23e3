"""`stats`: totals, an extension histogram, an image-size histogram (from image headers: nothing
is decoded) and samples per shard, as text or `--json`. Shards are read in parallel threads."""

from __future__ import annotations

import io
import json
import statistics
from typing import Any, Dict, List, Tuple

from .._shard.samples import TarShardSamples
from .._plan.urls import shard_name
from ._common import bar, is_image, say, shard_urls, worker_pool

__all__ = ["cmd_stats", "shard_stats"]

SIDE_EDGES = (64, 128, 256, 512, 1024, 2048, 4096)


def _bucket(side: int) -> str:
    low = 0
    for edge in SIDE_EDGES:
        if side <= edge:
            return f"{low + 1}-{edge}" if low else f"<={edge}"
        low = edge
    return f">{SIDE_EDGES[-1]}"


def _image_size(data: bytes) -> Tuple[int, int]:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return image.size


def shard_stats(url: str, images: bool = True) -> Dict[str, Any]:
    """One shard read through the loader's reader: counts, bytes per field, image sizes."""
    result: Dict[str, Any] = {"samples": 0, "members": 0, "bytes": 0, "fields": {}, "sizes": [], "unreadable_images": 0}
    for sample in TarShardSamples().run([url]):
        result["samples"] += 1
        for field, value in sample.items():
            if field.startswith("__"):
                continue
            result["members"] += 1
            result["bytes"] += len(value)
            count, size = result["fields"].get(field, (0, 0))
            result["fields"][field] = (count + 1, size + len(value))
            if images and is_image(field):
                try:
                    result["sizes"].append(_image_size(value))
                except Exception:  # stats describes; `verify` is the command that fails on it
                    result["unreadable_images"] += 1
    return result


def _collect(urls: List[str], threads: int, images: bool, quiet: bool) -> Dict[str, Any]:
    per_shard: Dict[str, int] = {}
    fields: Dict[str, List[int]] = {}
    sizes: List[Tuple[int, int]] = []
    totals = {"shards": 0, "samples": 0, "members": 0, "bytes": 0, "unreadable_images": 0}
    with worker_pool(max(1, min(threads, len(urls))), "shardstream-stats") as pool, \
            bar(len(urls), "shardstream stats", "shard", quiet) as progress:
        for url, found in zip(urls, pool.map(lambda u: shard_stats(u, images), urls)):
            progress.update()
            per_shard[shard_name(url)] = found["samples"]
            totals["shards"] += 1
            for key in ("samples", "members", "bytes", "unreadable_images"):
                totals[key] += found[key]
            for field, (count, size) in found["fields"].items():
                entry = fields.setdefault(field, [0, 0])
                entry[0] += count
                entry[1] += size
            sizes.extend(found["sizes"])
    histogram: Dict[str, int] = {}
    for edge in [_bucket(e) for e in SIDE_EDGES] + [_bucket(SIDE_EDGES[-1] + 1)]:
        histogram[edge] = 0
    for w, h in sizes:
        histogram[_bucket(max(w, h))] += 1
    counts = list(per_shard.values())
    return {
        **totals,
        "fields": {f: {"count": c, "bytes": b} for f, (c, b) in sorted(fields.items())},
        "images": len(sizes),
        "longer_side_histogram": {k: v for k, v in histogram.items() if v},
        "width": _spread([w for w, _ in sizes]),
        "height": _spread([h for _, h in sizes]),
        "samples_per_shard": _spread(counts),
        "shard_samples": per_shard,
    }


def _spread(values: List[int]) -> Dict[str, Any]:
    if not values:
        return {}
    mean = round(statistics.fmean(values), 2)
    return {"min": min(values), "median": statistics.median(values), "mean": mean, "max": max(values)}


def _text(report: Dict[str, Any]) -> List[str]:
    lines = [
        f"shards {report['shards']}  samples {report['samples']}  members {report['members']}  "
        f"payload {report['bytes'] / 1e6:.1f} MB",
    ]
    spread = report["samples_per_shard"]
    if spread:
        lines.append("samples per shard: " + "  ".join(f"{k} {v}" for k, v in spread.items()))
    lines.append(f"{'field':<16}{'count':>10}{'bytes':>14}{'avg bytes':>12}")
    for field, entry in report["fields"].items():
        average = entry["bytes"] // max(1, entry["count"])
        lines.append(f"{field:<16}{entry['count']:>10}{entry['bytes']:>14}{average:>12}")
    if report["images"]:
        lines.append(f"images {report['images']} (unreadable {report['unreadable_images']}); longer side:")
        peak = max(report["longer_side_histogram"].values())
        for label, count in report["longer_side_histogram"].items():
            lines.append(f"  {label:>10}{count:>10}  {'#' * max(1, round(40 * count / peak))}")
        for axis in ("width", "height"):
            lines.append(f"{axis}: " + "  ".join(f"{k} {v}" for k, v in report[axis].items()))
    return lines


def cmd_stats(args) -> int:
    report = _collect(shard_urls(args.urls), args.threads, not args.no_images, args.quiet)
    if args.json:
        say(json.dumps(report, ensure_ascii=False))
    else:
        for line in _text(report):
            say(line)
    return 0
