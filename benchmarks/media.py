"""Media decoding: samples/s and CPU per sample against the decode pool's thread count.

    .venv/bin/python benchmarks/media.py [--threads 1,2,3] [--repeat 1] [--only images,large,video,audio] [--quick]

Sections (every configuration runs in a fresh process, page cache warm, first pass by default;
shardstream iterates directly with `.with_engine(threads=N)`):

- `images` (the ImageNet-like corpus of corpus.py, ~500x375) and `large` (JPEGs of 1024-2048 px,
  mediacorpus.py), output 224x224 uint8, batches of 64:
  - `plain-center`: `.decode("pil")` + torchvision's eval transform `Resize(256)` +
    `CenterCrop(224)` on the PIL image (written with Pillow: torchvision is not in the venv);
  - `fused-center`: `.decode(wds.imagehandler("rgb8", size=224, crop="center"))`, the same pixels
    within the README's tolerance (`-sj`: backend="simplejpeg"; `-sjt`: backend="simplejpeg",
    resizer="torch");
  - `plain-random`: `.decode("pil")` + `RandomResizedCrop(224)` (torchvision's algorithm: crop,
    then resize);  `fused-random`: `imagehandler("rgb8", size=224, crop="random")` (`-sjt` as
    above).
- `video`: 2 s 320x240 h264 clips; `uniform8-112`: `videohandler("rgb8", uniform=8, size=112)`;
  `all-frames`: every frame at full size (what `torch_video` decodes).
- `audio`: 5 s 44.1 kHz stereo flac and mp3, `audiohandler(sample_rate=16000, channels=1)`.

Columns: samples/s; CPU s/1k (user+sys of the process, all threads, per 1000 samples); "x 1
thr" (over the same configuration's 1-thread rate); "of limit" (over cores x the 1-thread rate:
how close the pool comes to using every core as well as one thread uses one). Under the table:
samples per CPU-second of each fused configuration over its plain one, with the targets (1.3x
on `images`, 2x on `large`). Writes benchmarks/out/media.json and benchmarks/out/media.png.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"
sys.path.insert(0, str(HERE))

import corpus  # noqa: E402
import mediacorpus  # noqa: E402

BATCH = 64
TARGETS = {"images": 1.3, "large": 2.0}


@dataclass(frozen=True)
class MediaConfig:
    """One measured configuration: a section's corpus, a pipeline, a thread count."""

    section: str
    name: str
    threads: int


PIPELINES = {
    "images": ["plain-center", "fused-center", "fused-center-sj", "fused-center-sjt", "plain-random", "fused-random",
               "fused-random-sjt"],
    "large": ["plain-center", "fused-center", "fused-center-sj", "fused-center-sjt", "plain-random", "fused-random",
              "fused-random-sjt"],
    "video": ["uniform8-112", "all-frames"],
    "audio": ["flac", "mp3"],
}


def corpora(quick: bool) -> dict:
    """Shard paths per section (audio: per format), generating what is missing."""
    images = corpus.CorpusSpec(samples=256 if quick else 1000, shards=4)
    return {
        "images": corpus.ensure_corpus(images, OUT / f"corpus-{images.samples}x{images.shards}"),
        "large": mediacorpus.ensure_media_corpus(mediacorpus.MediaSpec("large", 64 if quick else 240)),
        "video": mediacorpus.ensure_media_corpus(mediacorpus.MediaSpec("video", 48 if quick else 160)),
        "flac": mediacorpus.ensure_media_corpus(mediacorpus.MediaSpec("audio-flac", 64 if quick else 240)),
        "mp3": mediacorpus.ensure_media_corpus(mediacorpus.MediaSpec("audio-mp3", 64 if quick else 240)),
    }


# --- the child: one configuration, one fresh process ------------------------------------------------


def plain_center(sample: dict) -> dict:
    """torchvision's Resize(256) + CenterCrop(224) on a PIL image, as an HWC uint8 array."""
    from PIL import Image
    import numpy as np

    image = sample["jpg"]
    w, h = image.size
    size = (256, int(256 * h / w)) if w <= h else (int(256 * w / h), 256)
    image = image.resize(size, Image.BILINEAR)
    top, left = int(round((image.height - 224) / 2.0)), int(round((image.width - 224) / 2.0))
    sample["jpg"] = np.asarray(image.crop((left, top, left + 224, top + 224)))
    return sample


def plain_random(sample: dict) -> dict:
    """torchvision's RandomResizedCrop(224) on a PIL image (crop, then resize), as an array."""
    import random

    from PIL import Image
    import numpy as np
    from shardstream._decode.fusedimage import random_box

    image = sample["jpg"]
    box = tuple(int(v) for v in random_box(image.width, image.height, (0.08, 1.0), (3 / 4, 4 / 3), random))
    sample["jpg"] = np.asarray(image.crop(box).resize((224, 224), Image.BILINEAR))
    return sample


def build(config: MediaConfig, urls: list):
    """The pipeline of `config` over `urls` (a callable that starts one pass)."""
    import shardstream as wds

    def dataset():
        return wds.WebDataset(urls, shardshuffle=False).with_engine(threads=config.threads)

    name = config.name
    if config.section in ("images", "large"):
        if name.startswith("plain"):
            transform = plain_center if name == "plain-center" else plain_random
            return lambda: dataset().decode("pil").map(transform).to_tuple("jpg", "cls").batched(BATCH)
        crop = "center" if "center" in name else "random"
        backend = "simplejpeg" if name.endswith(("-sj", "-sjt")) else "pillow"
        resizer = "torch" if name.endswith("-sjt") else "pillow"
        handler = wds.imagehandler("rgb8", size=224, crop=crop, backend=backend, resizer=resizer)
        return lambda: dataset().decode(handler).to_tuple("jpg", "cls").batched(BATCH)
    if config.section == "video":
        handler = wds.videohandler("rgb8", uniform=8, size=112) if name == "uniform8-112" else wds.videohandler("rgb8")
        return lambda: dataset().decode(handler).to_tuple("mp4", "cls").batched(8)
    handler = wds.audiohandler(sample_rate=16000, channels=1)
    return lambda: (dataset().decode(handler).to_tuple(name, "cls")
                    .map_tuple(lambda sound: sound[0], None).batched(16))


def count(batch) -> tuple:
    """Samples in a batch and the bytes of its data array."""
    data, labels = batch
    return len(labels), int(getattr(data, "nbytes", 0))


def child(spec_path: str, result_path: str) -> None:
    """Measure one configuration (run in its own process by `run_child`)."""
    from measure import timed_pass, warm_page_cache

    warnings.filterwarnings("ignore")
    spec = json.loads(Path(spec_path).read_text())
    config = MediaConfig(**spec["config"])
    warm_page_cache(spec["urls"])
    start_pass = build(config, spec["urls"])
    reps = [timed_pass(start_pass, count)[0] for _ in range(spec["repeat"])]
    Path(result_path).write_text(json.dumps([asdict(r) for r in reps]))


def run_child(config: MediaConfig, urls: list, repeat: int, timeout_s: float = 600) -> dict:
    """Measure `config` in a fresh Python process; its fastest pass, or the error."""
    with tempfile.TemporaryDirectory(prefix="shardstream-media-") as tmp:
        spec_path, result_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec_path.write_text(json.dumps({"config": asdict(config), "urls": urls, "repeat": repeat}))
        proc = subprocess.Popen([sys.executable, __file__, "--child", str(spec_path), str(result_path)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            _, stderr = proc.communicate(timeout=timeout_s)
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
        if proc.returncode != 0 or not result_path.exists():
            return {"error": (stderr.strip().splitlines() or ["no output"])[-1]}
        reps = json.loads(result_path.read_text())
    best = min(reps, key=lambda r: r["wall_s"])
    return {"rate": best["samples"] / best["wall_s"], "cpu_per_1k": 1000 * best["cpu_s"] / best["samples"],
            "samples": best["samples"], "reps": reps}


# --- the parent: corpora, every configuration, the table, the plot ------------------------------


def report(results: list, cores: int, header: str) -> list:
    """Print the table and the comparisons; return the comparison rows."""
    single = {(c.section, c.name): r["rate"] for c, r in results if c.threads == 1 and "rate" in r}
    print(header)
    columns = f"{'section':8} {'config':16} {'threads':>7} {'samples/s':>10} {'CPU s/1k':>9} {'x 1 thr':>8} {'of limit':>9}"
    print(columns)
    print("-" * len(columns))
    for config, result in results:
        if "error" in result:
            print(f"{config.section:8} {config.name:16} {config.threads:7d}  FAILED: {result['error']}")
            continue
        one = single.get((config.section, config.name))
        speedup = f"{result['rate'] / one:7.2f}x" if one else "       -"
        limit = f"{result['rate'] / (one * cores):8.0%}" if one else "        -"
        print(f"{config.section:8} {config.name:16} {config.threads:7d} {result['rate']:10,.0f} "
              f"{result['cpu_per_1k']:9.2f} {speedup} {limit}")
    print(f"x 1 thr: over the same config at 1 thread; of limit: over {cores} cores x its 1-thread rate")
    cpu = {(c.section, c.name, c.threads): r["cpu_per_1k"] for c, r in results if "cpu_per_1k" in r}
    rate = {(c.section, c.name, c.threads): r["rate"] for c, r in results if "rate" in r}
    rows = []
    print("\nfused over plain: samples per CPU-second (and samples/s), per thread count:")
    for section, target in TARGETS.items():
        for fused, plain in (("fused-center", "plain-center"), ("fused-center-sj", "plain-center"),
                             ("fused-center-sjt", "plain-center"), ("fused-random", "plain-random"),
                             ("fused-random-sjt", "plain-random")):
            threads = sorted({t for (s, n, t) in cpu if s == section and n == fused})
            pairs = [(t, cpu[(section, plain, t)] / cpu[(section, fused, t)],
                      rate[(section, fused, t)] / rate[(section, plain, t)])
                     for t in threads if (section, plain, t) in cpu]
            if not pairs:
                continue
            met = all(ratio >= target for _, ratio, _ in pairs)
            text = "  ".join(f"{t} thr {r:.2f}x ({w:.2f}x)" for t, r, w in pairs)
            verdict = f"target >= {target}: {'met' if met else 'MISSED'}"
            print(f"  {section:7} {fused:16} / {plain:13} {text}  {verdict}")
            rows.append({"section": section, "fused": fused, "plain": plain, "target": target, "met": met,
                         "per_threads": [{"threads": t, "cpu_ratio": r, "rate_ratio": w} for t, r, w in pairs]})
    return rows


def plot(results: list, cores: int, header: str, path: Path) -> None:
    """Per section: samples/s against threads (dotted: cores x the 1-thread rate), CPU s/1k below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sections = [s for s in PIPELINES if any(c.section == s for c, _ in results)]
    fig, axes = plt.subplots(2, len(sections), figsize=(4.2 * len(sections), 6.0), squeeze=False)
    for column, section in enumerate(sections):
        top, bottom = axes[0][column], axes[1][column]
        for index, name in enumerate(PIPELINES[section]):
            runs = sorted((c.threads, r) for c, r in results if c.section == section and c.name == name and "rate" in r)
            if not runs:
                continue
            threads = [t for t, _ in runs]
            colour = f"C{index}"
            top.plot(threads, [r["rate"] for _, r in runs], marker="o", color=colour, label=name)
            bottom.plot(threads, [r["cpu_per_1k"] for _, r in runs], marker="o", color=colour, label=name)
            if threads[0] == 1:
                top.axhline(runs[0][1]["rate"] * cores, color=colour, linestyle=":", linewidth=0.8)
            top.set_xticks(threads)
            bottom.set_xticks(threads)
        top.set_title(section, fontsize=9)
        top.set_ylabel("samples/s", fontsize=8)
        bottom.set_ylabel("CPU s per 1000 samples", fontsize=8)
        bottom.set_xlabel("decode threads", fontsize=8)
        for ax in (top, bottom):
            ax.tick_params(labelsize=7)
            ax.set_ylim(bottom=0)
        top.legend(fontsize=6)
    fig.suptitle(header + f"   (dotted: {cores} cores x the 1-thread rate)", fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    cores = os.cpu_count() or 1
    parser.add_argument("--threads", default=f"1,{cores},{cores + 1}", help="decode pool sizes")
    parser.add_argument("--repeat", type=int, default=1, help="passes per process; the fastest is shown")
    parser.add_argument("--only", default=",".join(PIPELINES), help="sections: images,large,video,audio")
    parser.add_argument("--quick", action="store_true", help="small corpora, for a smoke test")
    args = parser.parse_args()
    threads = sorted({int(t) for t in args.threads.split(",")} | {1})
    sections = [s for s in args.only.split(",") if s]
    paths = corpora(args.quick)
    load = os.getloadavg()[0]  # the machine may be shared: say how busy it was
    results = []
    started = time.perf_counter()
    for section in sections:
        for name in PIPELINES[section]:
            urls = paths[name] if section == "audio" else paths[section]
            for n in threads:
                config = MediaConfig(section, name, n)
                results.append((config, run_child(config, urls, args.repeat)))
    import shardstream

    sizes = {s: len(paths[s]) for s in paths}
    header = (f"cores={cores} python={sys.version.split()[0]} shardstream={shardstream.__version__} | "
              f"first pass in a fresh process{'' if args.repeat == 1 else f', best of {args.repeat}'} | "
              f"shards per corpus {sizes} | load average {load:.1f} at start, {os.getloadavg()[0]:.1f} at end")
    print()
    comparisons = report(results, cores, header)
    print(f"\n({time.perf_counter() - started:.0f} s)")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "media.json").write_text(json.dumps({
        "header": header, "cores": cores, "comparisons": comparisons,
        "results": [{"config": asdict(c), **r} for c, r in results]}, indent=1))
    plot(results, cores, header, OUT / "media.png")
    print(f"wrote {OUT / 'media.json'} and {OUT / 'media.png'}")
    return 1 if any("error" in r for _, r in results) else 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit(main())
