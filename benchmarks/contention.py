"""GIL contention: a training step that runs pure Python, fed by loaders in and out of its process.

    .venv/bin/python benchmarks/contention.py [--step-ms 0,5,20] [--batch 32] [--repeat 1]

The step is tokenizer-like (word lookups and list appends in a Python loop) and holds the GIL for
a calibrated time per batch. Two workloads over the benchmark corpus, batches of `--batch`:

- image: JPEG decode + center crop 224 (the decode workload): Pillow releases the GIL, so the
  loader needs the CPU more than the GIL.
- text: the caption (`txt`) through a pure-Python tokenizer, ~0.5 ms per sample (OpenCLIP's
  default tokenizer is pure Python and runs in the loader), plus the label: the loader needs the GIL.

Configurations:

- shardstream-threads: the dataset iterated in the training process (engine threads there).
- shardstream-subprocess: `shardstream.SubprocessLoader(dataset)`: the same pipeline in one
  helper process, batches through shared memory.
- webdataset-dl2: webdataset 1.0.2 in `torch.utils.data.DataLoader(num_workers=2)`.
- shardstream-wl2: `shardstream.WebLoader(num_workers=2)`, for reference.

Every configuration and step time runs in its own fresh process (torch imported there and in
every helper or worker), on its first pass: start-up is in the figures. A step time of 0 is the
loader alone. Columns: samples/s over the whole pass, start-up included; after 1st, samples/s
from the first batch on (the steady state); step ms, the step alone in that process
before the pass -> its mean during the pass (longer when loader threads take the GIL or the
CPU from it); waited, the share of the pass the loop spent waiting for the next batch; first
ms, time to the first batch; of bound, samples/s over what the step alone allows (batch /
nominal step time). The loader is built before the timed pass, as a training script builds it
before its model; building a SubprocessLoader starts the forkserver, whose imports (torch: ~1 s)
overlap that set-up. Prints a table, writes out/contention.json and out/contention.png.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"
CONFIGS = ["shardstream-threads", "shardstream-subprocess", "webdataset-dl2", "shardstream-wl2"]
VOCAB = {word: i for i, word in enumerate(
    "a the dog cat bird car tree house boat field river city snow beach red small old running".split())}
SENTENCE = "the small red dog running by the old river in the snow near a house".split()
WORKLOADS = ["image", "text"]
TOKENIZE_MS = 0.5  # pure-Python work per sample in the text workload's loader


def step(iterations: int) -> int:
    """Tokenizer-like pure-Python work: look every word up, build id lists (holds the GIL)."""
    total = 0
    for _ in range(iterations):
        ids = [VOCAB.get(word, 0) for word in SENTENCE]
        ids.append(len(ids))
        total += sum(ids)
    return total


def tokenize(sample: dict, iterations: int) -> tuple:
    """The text workload's per-sample loader work: the caption's word ids, the label."""
    step(iterations)
    return [VOCAB.get(word, 0) for word in sample["txt"].decode().split()], int(sample["cls"])


def calibrate(ms: float) -> int:
    """Iterations of `step` that take `ms` milliseconds of this thread's CPU time (robust to
    other processes on a busy machine; median of 5)."""
    if ms <= 0:
        return 0
    n = 2000
    while True:
        runs = []
        for _ in range(5):
            start = time.thread_time()
            step(n)
            runs.append(time.thread_time() - start)
        took = sorted(runs)[2]
        if took > 0.02:
            return max(1, int(n * ms / 1000 / took))
        n *= 4


def pipeline(wds, workload: str, urls: list[str], batch: int, tokenize_iterations: int):
    dataset = wds.WebDataset(urls, shardshuffle=False)
    if workload == "text":
        from contention import tokenize  # by module name, so that helpers and workers find it

        return dataset.map(functools.partial(tokenize, iterations=tokenize_iterations)).batched(batch)
    from decode import center_crop

    return dataset.decode("pil").map(center_crop).to_tuple("jpg", "cls").batched(batch)


def make_loader(config: str, workload: str, urls: list[str], batch: int, tokenize_iterations: int):
    import torch

    if config.startswith("webdataset"):
        import webdataset

        dataset = pipeline(webdataset, workload, urls, batch, tokenize_iterations)
        return torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
    import shardstream

    dataset = pipeline(shardstream, workload, urls, batch, tokenize_iterations)
    if config == "shardstream-subprocess":
        return shardstream.SubprocessLoader(dataset, buffer=4)
    if config == "shardstream-wl2":
        return shardstream.WebLoader(dataset, batch_size=None, num_workers=2)
    return dataset


def child(config: str, workload: str, urls: list[str], batch: int, iterations: int, tokenize_iterations: int) -> dict:
    """One first pass in this fresh process: the training loop, timed."""
    import torch  # noqa: F401  # the training process has torch, as a real one does

    from measure import warm_page_cache

    loader = make_loader(config, workload, urls, batch, tokenize_iterations)  # untimed set-up, as a training script builds its loader first
    warm_page_cache(urls)
    alone = []
    for _ in range(5):  # the step alone in this process, now: what the loop's step time compares with
        before = time.perf_counter()
        step(iterations)
        alone.append(time.perf_counter() - before)
    clock = time.perf_counter
    waited = stepped = 0.0
    samples = batches = 0
    first = None
    start = clock()
    it = iter(loader)
    while True:
        before = clock()
        try:
            _inputs, labels = next(it)
        except StopIteration:
            break
        got = clock()
        waited += got - before
        if first is None:
            first = got - start
        step(iterations)
        stepped += clock() - got
        samples += len(labels)
        batches += 1
    wall = clock() - start
    return {"config": config, "workload": workload, "samples": samples, "batches": batches, "wall_s": wall, "waited_s": waited,
            "stepped_s": stepped, "first_s": first or 0.0, "alone_s": sorted(alone)[2]}


def run_child(config: str, workload: str, urls: list[str], batch: int, iterations: int, tokenize_iterations: int,
              timeout_s: float) -> dict:
    from harness import _run_child

    command = [sys.executable, str(Path(__file__).resolve()), "--child", config, "--workloads", workload,
               "--batch", str(batch), "--iterations", str(iterations), "--tokenize-iterations", str(tokenize_iterations),
               "--urls", json.dumps(urls)]
    failed = {"config": config, "workload": workload}
    try:
        code, output = _run_child(command, dict(os.environ), timeout_s)
    except subprocess.TimeoutExpired:
        return {**failed, "error": f"timed out after {timeout_s:.0f} s"}
    lines = [line for line in output.strip().splitlines() if line.startswith("{")]
    if code != 0 or not lines:
        tail = output.strip().splitlines()[-1:] or ["no output"]
        return {**failed, "error": f"exit {code}: {tail[0]}"}
    return json.loads(lines[-1])


def header(spec, urls: list[str], batch: int) -> str:
    import torch
    import webdataset

    import shardstream

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE).stdout.strip()
    except OSError:
        commit = "?"
    return (f"cores={os.cpu_count()} python={sys.version.split()[0]} torch={torch.__version__} "
            f"webdataset={webdataset.__version__} shardstream={shardstream.__version__} ({commit}) | "
            f"corpus {spec.samples} samples / {len(urls)} shards | batches of {batch} | "
            "first pass, each configuration in a fresh process")


def table(rows: list[dict], batch: int) -> str:
    lines = [f"{'workload':8} {'config':22} {'step':>4} {'samples/s':>9} {'after 1st':>9} {'step ms':>13} {'waited':>6} "
             f"{'first ms':>8} {'of bound':>8}",
             f"{'-' * 8} {'-' * 22} {'-' * 4} {'-' * 9} {'-' * 9} {'-' * 13} {'-' * 6} {'-' * 8} {'-' * 8}"]
    for row in rows:
        nominal = row["step_ms"]
        name = f"{row['workload']:8} {row['config']:22} {nominal:4.0f}"
        if "error" in row:
            lines.append(f"{name} failed: {row['error']}")
            continue
        rate = row["samples"] / row["wall_s"]
        after = (row["samples"] - batch) / max(1e-9, row["wall_s"] - row["first_s"])
        if nominal:
            step_ms = f"{1000 * row['alone_s']:5.1f} -> {1000 * row['stepped_s'] / max(1, row['batches']):5.1f}"
            bound = f"{rate / (batch * 1000 / nominal):.0%}"
        else:
            step_ms, bound = "-", "-"
        lines.append(f"{name} {rate:9,.0f} {after:9,.0f} {step_ms:>13} {row['waited_s'] / row['wall_s']:6.0%} "
                     f"{1000 * row['first_s']:8.0f} {bound:>8}")
    lines.append("step: nominal ms of Python per batch (0: the loader alone); samples/s: the whole first pass, start-up\n"
                 "included; after 1st: from the first batch on; step ms: alone -> during the pass (mean); waited: share\n"
                 "of the pass spent waiting for data; of bound: samples/s over batch / nominal step")
    return "\n".join(lines)


def plot(rows: list[dict], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = [w for w in WORKLOADS if any(r["workload"] == w for r in rows)]
    steps = sorted({r["step_ms"] for r in rows})
    configs = [c for c in CONFIGS if any(r["config"] == c for r in rows)]
    fig, axes = plt.subplots(1, len(workloads), figsize=(5 * len(workloads), 3.4), squeeze=False)
    width = 0.8 / len(configs)
    for ax, workload in zip(axes[0], workloads):
        for i, config in enumerate(configs):
            values = []
            for s in steps:
                match = [r for r in rows if (r["workload"], r["config"], r["step_ms"]) == (workload, config, s) and "error" not in r]
                values.append(max((r["samples"] / r["wall_s"] for r in match), default=0))
            ax.bar([j + i * width for j in range(len(steps))], values, width, label=config)
        ax.set_xticks([j + width * (len(configs) - 1) / 2 for j in range(len(steps))])
        ax.set_xticklabels([f"step {s:g} ms" if s else "loader alone" for s in steps], fontsize=8)
        ax.set_title(f"{workload} workload", fontsize=9)
        ax.set_ylabel("samples/s (higher is better)", fontsize=8)
        ax.legend(fontsize=6)
    fig.suptitle(title, fontsize=6)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--step-ms", default="0,5,20", help="nominal Python time per step, comma-separated")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=1, help="runs of every row (each in a fresh process)")
    parser.add_argument("--samples", type=int, default=4000)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--out", type=Path, default=OUT, help="where contention.json and contention.png go")
    parser.add_argument("--corpus-dir", type=Path, default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--iterations", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--tokenize-iterations", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--urls", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = child(args.child, args.workloads, json.loads(args.urls), args.batch, args.iterations, args.tokenize_iterations)
        print(json.dumps(result), flush=True)
        return 0
    import warnings

    warnings.filterwarnings("ignore")
    import corpus

    spec = corpus.CorpusSpec(samples=args.samples, shards=args.shards)
    default = spec == corpus.CorpusSpec()
    directory = corpus.DEFAULT_DIR if default else corpus.DEFAULT_DIR.with_name(f"corpus-{spec.samples}x{spec.shards}")
    directory = args.corpus_dir or directory
    urls = [str(u) for u in corpus.ensure_corpus(spec, directory)]
    steps = [float(s) for s in args.step_ms.split(",")]
    load_before = os.getloadavg()[0]  # other processes on the machine: the figures' noise
    iterations = {s: calibrate(s) for s in steps}
    tokenize_iterations = calibrate(TOKENIZE_MS)
    rows = []
    for _ in range(args.repeat):
        for workload in args.workloads.split(","):
            for s in steps:
                for config in args.configs.split(","):
                    row = run_child(config, workload, urls, args.batch, iterations[s], tokenize_iterations, args.timeout)
                    row["step_ms"] = s
                    if "error" not in row and row["samples"] != spec.samples:
                        row["error"] = f"saw {row['samples']} samples, corpus has {spec.samples}"
                    rows.append(row)
                    done = row.get("error") or f"{row['samples'] / row['wall_s']:,.0f} samples/s"
                    print(f"  {workload} {config} step {s:g} ms: {done}", file=sys.stderr, flush=True)
    title = header(spec, urls, args.batch) + f" | load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after"
    print(title)
    print(table(rows, args.batch))
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    meta = {"header": title, "step_iterations": iterations, "tokenize_iterations": tokenize_iterations}
    (out / "contention.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
    plot(rows, title, out / "contention.png")
    print(f"wrote {out / 'contention.json'} and {out / 'contention.png'}")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    raise SystemExit(main())
