"""`create`: list the source, plan the shards, have an engine write them, then `sizes.json`
(and `classes.json` for an image folder)."""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from typing import Dict, List, Set

from .._base.errors import UsageError
from ._dest import Destination
from ._engines import run_local, run_ray
from ._options import CreateOptions
from ._plan import plan_shards, rank_slice
from ._shardfile import ShardResult, WriteContext
from ._sources import list_source

__all__ = ["CreateSummary", "create_shards"]


@dataclass
class CreateSummary:
    """What a `create` run did; `samples_per_s` counts the write phase (listing and the start
    of a local Ray excluded: `list_s`, `engine_start_s`)."""

    dest: str
    engine: str
    workers: int
    shards: int = 0
    samples: int = 0
    file_bytes: int = 0
    payload_bytes: int = 0
    list_s: float = 0.0
    engine_start_s: float = 0.0
    write_s: float = 0.0
    failures: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    names: List[str] = field(default_factory=list)

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.write_s if self.write_s > 0 else 0.0

    def as_dict(self) -> Dict[str, object]:
        return {
            "dest": self.dest, "engine": self.engine, "workers": self.workers, "shards": self.shards,
            "samples": self.samples, "file_bytes": self.file_bytes, "payload_bytes": self.payload_bytes,
            "list_s": round(self.list_s, 3), "engine_start_s": round(self.engine_start_s, 3),
            "write_s": round(self.write_s, 3),
            "samples_per_s": round(self.samples_per_s, 1), "failures": self.failures, "notes": self.notes,
        }


def _json_bytes(value: Dict[str, int]) -> bytes:
    return json.dumps(dict(sorted(value.items())), indent=1).encode()  # as `index` writes it


def _clear_for_overwrite(dest: Destination, pattern: str, planned: Set[str], mine: Set[str], stale: bool) -> None:
    """--overwrite, before writing: this process's shards go, with their indexes (a run that
    fails part way must not leave the earlier dataset's shards beside its own), and with `stale`
    (one process does it) `sizes.json` and `classes.json` and the shards of an earlier, larger run
    (named by the same pattern, not in this plan), so that DEST holds this run's dataset and
    nothing else: all of it once the run succeeds, part of it without `sizes.json` if it fails."""
    head, _, tail = re.split(r"(%0?\d*d)", pattern, maxsplit=1)
    named = re.compile(re.escape(head) + r"\d+" + re.escape(tail) + r"(\.idx|\.dali\.idx)?")
    for name in dest.names():
        match = named.fullmatch(name)
        if match is None:
            if stale and name in ("sizes.json", "classes.json"):
                dest.remove(name)
            continue
        shard = name[: len(name) - len(match.group(1) or "")]
        if (stale and shard not in planned) or shard in mine:
            dest.remove(name)


def create_shards(opts: CreateOptions) -> CreateSummary:
    """Run `shardstream create`. Raises UsageError (bad input, DEST not empty) and
    ShardStreamError (a sample or shard failed)."""
    from tqdm import tqdm

    started = time.perf_counter()
    listing = list_source(opts, progress=opts.progress)
    rows = listing.rows
    if opts.rekey:
        rows = [row._replace(key=f"{number:09d}") for number, row in enumerate(rows)]
    tasks = plan_shards(rows, pattern=opts.pattern, maxcount=opts.maxcount, maxsize=opts.maxsize, seed=opts.seed)
    mine = rank_slice(tasks, opts.rank, opts.world_size) if opts.world_size > 1 else tasks
    writes_sizes = opts.rank == 0
    dest = Destination(opts.dest)
    dest.prepare()
    if not opts.overwrite:
        taken = [task.name for task in mine if dest.exists(task.name)]
        taken += [name for name in ("sizes.json",) if writes_sizes and dest.exists(name)]
        if taken:
            more = " ..." if len(taken) > 3 else ""
            raise UsageError(f"DEST already holds {', '.join(taken[:3])}{more}: --overwrite replaces them")
    else:
        _clear_for_overwrite(dest, opts.pattern, {task.name for task in tasks}, {task.name for task in mine},
                             stale=writes_sizes)
    workers = opts.workers or max(1, min(os.cpu_count() or 1, len(mine)))
    ctx = WriteContext(
        dest, tuple(listing.shard_urls), opts.reencode, opts.threads, opts.skip_errors, opts.mtime or 0, opts.dali_index,
        tuple(listing.shard_counts),
    )
    summary = CreateSummary(dest.url, opts.engine, workers, list_s=time.perf_counter() - started)
    results: List[ShardResult] = []
    total = sum(len(t.rows) for t in mine)
    bar = tqdm(total=total, unit="sample", desc="shardstream create", disable=None if opts.progress else True)

    def on_result(result: ShardResult) -> None:
        results.append(result)
        bar.update(result.samples + len(result.failures))

    write_started = time.perf_counter()

    def engine_ready() -> None:
        nonlocal write_started
        now = time.perf_counter()
        summary.engine_start_s = now - write_started
        write_started = now

    try:
        if opts.engine == "ray":
            run_ray(mine, ctx, on_result, address=opts.ray_address, cpus=opts.workers, on_ready=engine_ready)
        else:
            run_local(mine, ctx, workers, on_result)
    finally:
        bar.close()
    results.sort(key=lambda r: r.number)
    if opts.world_size == 1:
        dest.write_bytes("sizes.json", _json_bytes({r.name: r.samples for r in results}))
    elif writes_sizes:  # the plan's counts: exact, since --skip-errors is refused here
        dest.write_bytes("sizes.json", _json_bytes({t.name: len(t.rows) for t in tasks}))
    if listing.classes is not None and writes_sizes:
        dest.write_bytes("classes.json", _json_bytes(listing.classes))
    summary.write_s = time.perf_counter() - write_started
    for result in results:
        summary.shards += 1
        summary.samples += result.samples
        summary.file_bytes += result.file_bytes
        summary.payload_bytes += result.payload_bytes
        summary.failures.extend(result.failures)
        summary.notes.extend(result.notes)
        summary.names.append(result.name)
    return summary

