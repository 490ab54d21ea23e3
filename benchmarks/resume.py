"""What a mid-epoch resume costs: checkpoint late in an epoch, then time a fresh process-like
resume to its first batch and to the end of the epoch.

    .venv/bin/python benchmarks/resume.py [--at 0.9] [--repeat 2]

The pipeline is the decode workload's (JPEG decode, center crop, batches of 64) over the benchmark
corpus. Configurations:

- webdataset (restart + skip): webdataset has no resume; the usual workaround is to restart the
  epoch and drop the batches already trained on. Baseline.
- shardstream replay: a state without a position (what unordered output falls back to): the
  epoch is replayed, decoded, and the delivered batches are dropped.
- shardstream count: `.shuffle(256)` before decode, so the pipeline holds samples back; the state
  holds the shuffle's output count: tar reading and the shuffle are replayed, decode is not.
- shardstream seek: the plain pipeline; the state holds (shard, sample, byte offset): nothing
  before the checkpoint is read again.

Prints a table and writes benchmarks/out/resume.png. Timings are wall seconds on this machine
(noisy); the ratio column compares each row with the baseline in the same run.
"""

from __future__ import annotations

import argparse
import itertools
import os
import time
import warnings
from pathlib import Path

import corpus
from decode import BATCH, center_crop

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"

warnings.filterwarnings("ignore")


def build(wds, urls, shuffle: bool):
    dataset = wds.WebDataset(urls, shardshuffle=False, seed=7)
    if shuffle:
        dataset = dataset.shuffle(256)
    return dataset.decode("pil").map(center_crop).to_tuple("jpg", "cls").batched(BATCH)


def timed_rest(iterator) -> tuple[float, float, int]:
    """(seconds to the first batch, seconds to the end, batches) of an iterator just created."""
    start = time.perf_counter()
    first = None
    batches = 0
    for _ in iterator:
        batches += 1
        if first is None:
            first = time.perf_counter() - start
    return first or 0.0, time.perf_counter() - start, batches


def checkpoint(wds, urls, shuffle: bool, batches: int, drop_position: bool = False) -> dict:
    dataset = build(wds, urls, shuffle)
    it = iter(dataset)
    for _ in range(batches):
        next(it)
    state = dataset.state_dict()
    it.close()
    if drop_position:
        state["position"] = None
    return state


def run(urls: list[str], at: float) -> list[tuple[str, float, float, int, str]]:
    import shardstream
    import webdataset

    total_batches = -(-sum(1 for _ in shardstream.WebDataset(urls, shardshuffle=False)) // BATCH)
    done = int(total_batches * at)
    rows = []

    def webdataset_restart():
        return itertools.islice(iter(build(webdataset, urls, False)), done, None)

    first, whole, n = timed_rest(webdataset_restart())
    rows.append(("webdataset (restart + skip)", first, whole, n, "-"))
    for name, shuffle, drop in (("shardstream replay", False, True), ("shardstream count", True, False),
                                ("shardstream seek", False, False)):
        state = checkpoint(shardstream, urls, shuffle, done, drop)
        dataset = build(shardstream, urls, shuffle)
        dataset.load_state_dict(state)
        first, whole, n = timed_rest(iter(dataset))
        position = state["position"]
        kind = "none" if position is None else ("seek" if len(position) == 4 else "count")
        rows.append((name, first, whole, n, kind))
    return rows


def plot(rows, header: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 2.6))
    names = [r[0] for r in rows]
    ax.barh(names, [r[1] for r in rows], color="#4c72b0", label="to first batch")
    ax.barh(names, [r[2] - r[1] for r in rows], left=[r[1] for r in rows], color="#dd8452", label="rest of the epoch")
    ax.invert_yaxis()
    ax.set_xlabel("seconds after load_state_dict (lower is better)")
    ax.legend(fontsize=8)
    ax.tick_params(labelsize=8)
    fig.suptitle(header, fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--at", type=float, default=0.9, help="checkpoint after this fraction of the epoch")
    parser.add_argument("--repeat", type=int, default=2, help="runs; the fastest of each row is shown")
    args = parser.parse_args()
    spec = corpus.CorpusSpec()
    urls = [str(u) for u in corpus.ensure_corpus(spec, corpus.DEFAULT_DIR)]
    best: dict[str, tuple] = {}
    for _ in range(args.repeat):
        for row in run(urls, args.at):
            if row[0] not in best or row[2] < best[row[0]][2]:
                best[row[0]] = row
    rows = list(best.values())
    header = (f"cores={os.cpu_count()} | corpus {spec.samples} samples / {len(urls)} shards | "
              f"checkpoint at {args.at:.0%} of the epoch | best of {args.repeat}")
    base = rows[0][2]
    print(header)
    print(f"{'config':30} {'position':>8} {'first batch s':>14} {'rest of epoch s':>16} {'batches':>8} {'ratio':>6}")
    for name, first, whole, n, kind in rows:
        print(f"{name:30} {kind:>8} {first:14.2f} {whole:16.2f} {n:8d} {base / whole:5.1f}x")
    print("ratio = the baseline's time to finish the epoch over this row's (higher is better)")
    plot(rows, header, OUT / "resume.png")
    print(f"wrote {OUT / 'resume.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
