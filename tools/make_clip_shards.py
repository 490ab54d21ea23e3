"""Make a synthetic image-caption dataset whose captions describe the images: jpg + txt shards.

    python tools/make_clip_shards.py data/clip --train 10000 --eval 500

writes data/clip/train-000000.tar ... (``--shard-size`` samples each, the last one shorter),
data/clip/eval-000000.tar (a held-out shard whose captions are all different, for retrieval)
and data/clip/sizes.json (sample counts per shard, which split_by_node reads to give every rank
the same number of samples). Each image shows one or two groups of shapes on a dark noisy
background, and its caption says what they are, e.g. "two red circles on the left and a blue
square on the right". The same seed gives the same bytes.

``--bad N`` replaces N training images with truncated JPEGs and drops the caption of N others,
the way real scraped data is broken: a training pipeline must skip them and go on.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import random
import sys

import numpy as np
from PIL import Image, ImageDraw

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import shardstream as wds  # noqa: E402

COLOURS = {"red": (220, 45, 45), "green": (50, 190, 70), "blue": (60, 100, 240), "yellow": (235, 215, 50),
           "white": (235, 235, 235)}
SHAPES = {"circle": "circles", "square": "squares", "triangle": "triangles"}
COUNTS = {1: "a", 2: "two", 3: "three"}
# where a group sits: a box in unit coordinates (x0, y0, x1, y1) and how the caption says it
PLACES = {"left": ((0.0, 0.0, 0.5, 1.0), "on the left"), "right": ((0.5, 0.0, 1.0, 1.0), "on the right"),
          "top": ((0.0, 0.0, 1.0, 0.5), "at the top"), "bottom": ((0.0, 0.5, 1.0, 1.0), "at the bottom"),
          "center": ((0.25, 0.25, 0.75, 0.75), "in the center")}
PAIRS = [("left", "right"), ("top", "bottom")]  # two groups sit apart, named in this order


def random_scene(rng: random.Random) -> list:
    """One or two groups: [(count, colour, shape, place), ...]."""
    def group(place):
        return (rng.randint(1, 3), rng.choice(list(COLOURS)), rng.choice(list(SHAPES)), place)

    if rng.random() < 0.5:
        return [group(rng.choice(list(PLACES)))]
    return [group(place) for place in rng.choice(PAIRS)]


def caption(scene: list) -> str:
    parts = []
    for count, colour, shape, place in scene:
        noun = shape if count == 1 else SHAPES[shape]
        parts.append(f"{COUNTS[count]} {colour} {noun} {PLACES[place][1]}")
    return " and ".join(parts)


def draw_shape(draw: ImageDraw.ImageDraw, shape: str, cx: float, cy: float, r: float, fill) -> None:
    if shape == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
    elif shape == "square":
        s = r * 0.85
        draw.rectangle([cx - s, cy - s, cx + s, cy + s], fill=fill)
    else:
        draw.polygon([(cx, cy - r), (cx + r * math.sqrt(3) / 2, cy + r / 2), (cx - r * math.sqrt(3) / 2, cy + r / 2)],
                     fill=fill)


def render(scene: list, size: int, rng: random.Random) -> Image.Image:
    """Draw the scene: objects placed at random inside their group's box, never overlapping."""
    noise = np.random.default_rng(rng.getrandbits(64)).normal(rng.randint(20, 70), rng.uniform(3, 10), (size, size, 1))
    image = Image.fromarray(np.repeat(noise.clip(0, 255).astype(np.uint8), 3, axis=2))
    draw = ImageDraw.Draw(image)
    placed = []  # (cx, cy, r) in pixels
    for count, colour, shape, place in scene:
        (x0, y0, x1, y1), _ = PLACES[place]
        jitter = tuple(max(0, min(255, c + rng.randint(-20, 20))) for c in COLOURS[colour])
        for _ in range(count):
            for _attempt in range(100):
                r = rng.uniform(0.07, 0.10) * size
                cx = rng.uniform(x0 * size + r + 1, x1 * size - r - 1)
                cy = rng.uniform(y0 * size + r + 1, y1 * size - r - 1)
                if all(math.hypot(cx - px, cy - py) > r + pr + 2 for px, py, pr in placed):
                    break
            placed.append((cx, cy, r))
            draw_shape(draw, shape, cx, cy, r, jitter)
    return image


def jpeg(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def write_split(pattern: str, count: int, size: int, rng: random.Random, *, shard_size: int, prefix: str,
                unique: bool = False, bad: int = 0) -> dict:
    """Write `count` samples into shards named by `pattern`; returns {file name: samples}."""
    sizes: dict = {}
    seen: set = set()
    broken = set(rng.sample(range(count), min(count, 2 * bad))) if bad else set()
    truncated = set(sorted(broken)[::2])
    with wds.ShardWriter(pattern, maxcount=shard_size, verbose=0, mtime=0) as sink:  # same seed, same bytes
        for i in range(count):
            while True:
                scene = random_scene(rng)
                text = caption(scene)
                if not unique or text not in seen:
                    break
            seen.add(text)
            sample = {"__key__": f"{prefix}{i:07d}", "jpg": jpeg(render(scene, size, rng)), "txt": text}
            if i in truncated:
                sample["jpg"] = sample["jpg"][: len(sample["jpg"]) // 3]
            elif i in broken:
                del sample["txt"]
            sink.write(sample)
            name = os.path.basename(sink.fname)
            sizes[name] = sizes.get(name, 0) + 1
    return sizes


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="directory to write the shards into")
    parser.add_argument("--train", type=int, default=10000, help="training samples")
    parser.add_argument("--eval", type=int, default=500, help="held-out samples, all captions different")
    parser.add_argument("--shard-size", type=int, default=1000, help="samples per training shard")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--prefix", default="train", help="shard and key prefix (a second source: another prefix)")
    parser.add_argument("--bad", type=int, default=0, help="truncated JPEGs (and as many samples without a caption)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    os.makedirs(args.out, exist_ok=True)
    rng = random.Random(args.seed)
    sizes = write_split(os.path.join(args.out, f"{args.prefix}-%06d.tar"), args.train, args.image_size, rng,
                        shard_size=args.shard_size, prefix=f"{args.prefix}-", bad=args.bad)
    if args.eval:
        eval_rng = random.Random(f"eval-{args.seed}")
        sizes.update(write_split(os.path.join(args.out, "eval-%06d.tar"), args.eval, args.image_size, eval_rng,
                                 shard_size=args.eval, prefix="eval-", unique=True))
    path = os.path.join(args.out, "sizes.json")
    if os.path.exists(path):  # another source in the same directory: keep its counts
        with open(path) as f:
            sizes = {**json.load(f), **sizes}
    with open(path, "w") as f:
        json.dump(dict(sorted(sizes.items())), f, indent=1)
    shards = sum(1 for name in sizes if name.startswith(f"{args.prefix}-"))
    print(f"train: {os.path.join(args.out, args.prefix)}-{{000000..{shards - 1:06d}}}.tar ({args.train} samples)")
    if args.eval:
        print(f"eval:  {os.path.join(args.out, 'eval-000000.tar')} ({args.eval} samples)")


if __name__ == "__main__":
    main()
