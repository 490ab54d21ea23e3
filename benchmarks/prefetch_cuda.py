"""Host-to-device overlap: batches/s of a GPU step with and without DevicePrefetcher (needs CUDA).

    .venv/bin/python benchmarks/prefetch_cuda.py [--batches 200] [--batch 128] [--step-ms 10]

Batches are uint8 image tensors (batch x 3 x 224 x 224, ~19 MB at 128) in pageable host memory,
as a loader hands them over. The step is a chain of matmuls on the device, sized to take about
`--step-ms`. Rows:

- copy only: `batch.to(device)` and nothing else (pageable memory, synchronous): the copy's cost.
- step only: the step on a batch already on the device.
- plain: `batch.to(device)` then the step, in the loop (the copy and the step take turns).
- prefetcher: `DevicePrefetcher(batches, device, depth=2)`: pinned copies on a side stream,
  overlapping the step.
- prefetcher over SubprocessLoader: the same, batches arriving from a helper process. Its
  forkserver is started (and has imported torch) before the timing, as it is in a training job
  after the first epoch: that one-time start-up is printed on its own line. (Timed inside the
  row, it made the row look 3x slower on an H100 machine: 2-3 s of start-up over 200 batches.)

overlap = (plain - prefetcher) / copy only, per batch: 100% when the copy hides entirely behind
the step. Without CUDA it says so and exits 0.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

import shardstream as wds


class Batches:
    """`n` fresh host batches (a picklable iterable, so a SubprocessLoader can run it)."""

    def __init__(self, n: int, batch: int) -> None:
        self.n, self.batch = n, batch

    def __iter__(self):
        for i in range(self.n):
            yield torch.full((self.batch, 3, 224, 224), i % 251, dtype=torch.uint8), torch.arange(self.batch)


def make_step(device: torch.device, step_ms: float):
    weights = torch.randn(2048, 2048, device=device)

    def step(images: torch.Tensor, rounds: int) -> torch.Tensor:
        x = images[:, 0, :16, :128].float().reshape(-1, 2048)[:8].repeat(256, 1)
        for _ in range(rounds):
            x = torch.tanh(x @ weights)
        return x.sum()

    probe = torch.zeros(128, 3, 224, 224, dtype=torch.uint8, device=device)
    step(probe, 1)
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    step(probe, 20)
    torch.cuda.synchronize(device)
    per_round = (time.perf_counter() - start) / 20
    rounds = max(1, int(step_ms / 1000 / per_round))
    return lambda images: step(images, rounds)


def timed(loop) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    loop()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--step-ms", type=float, default=10.0)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device here: nothing to measure")
        return 0
    device = torch.device("cuda")
    step = make_step(device, args.step_ms)
    n = args.batches
    on_device = next(iter(Batches(1, args.batch)))[0].to(device)

    def copy_only():
        for images, labels in Batches(n, args.batch):
            images.to(device), labels.to(device)

    def step_only():
        for _ in range(n):
            step(on_device)

    def plain():
        for images, labels in Batches(n, args.batch):
            step(images.to(device))
            labels.to(device)

    def prefetched(source):
        def loop():
            for images, _labels in wds.DevicePrefetcher(source, device=device, depth=2):
                step(images)
        return loop

    start = time.perf_counter()
    list(wds.SubprocessLoader(Batches(1, 1)))  # the forkserver's start-up: once per job, not per epoch
    startup = time.perf_counter() - start
    rows = [
        ("copy only", timed(copy_only)),
        ("step only", timed(step_only)),
        ("plain (copy, then step)", timed(plain)),
        ("prefetcher", timed(prefetched(Batches(n, args.batch)))),
        ("prefetcher over SubprocessLoader", timed(prefetched(wds.SubprocessLoader(Batches(n, args.batch))))),
    ]
    seconds = dict(rows)
    print(f"cores={os.cpu_count()} python={sys.version.split()[0]} torch={torch.__version__} "
          f"device={torch.cuda.get_device_name(device)} | {n} batches of {args.batch}x3x224x224 uint8 | step ~{args.step_ms:g} ms")
    print(f"SubprocessLoader start-up (forkserver importing torch, once per job): {startup:.2f} s, not in the rows")
    print(f"{'config':34} {'batches/s':>9} {'ms/batch':>8}")
    for name, s in rows:
        print(f"{name:34} {n / s:9.1f} {1000 * s / n:8.2f}")
    copy = seconds["copy only"]
    for name in ("prefetcher", "prefetcher over SubprocessLoader"):
        print(f"overlap ({name}): {(seconds['plain (copy, then step)'] - seconds[name]) / copy:.0%} of the copy hidden")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
