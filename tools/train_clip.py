"""Train a small CLIP on image-caption shards with shardstream: the script to copy for a real run.

    python tools/make_clip_shards.py demo-data/clip --train 10000 --eval 500
    OMP_NUM_THREADS=1 torchrun --nproc_per_node=2 --master_addr=127.0.0.1 --master_port=29511 \\
        tools/train_clip.py --train-data "demo-data/clip/train-{000000..000009}.tar" \\
        --val-data demo-data/clip/eval-000000.tar --output-dir demo-data/clip-run
    # interrupted? the same command with --resume latest, on any number of ranks

The data path is OpenCLIP's (open_clip_train/data.py, get_wds_dataset), written with shardstream:

  shards    a `::` list of sources (local paths, http(s)://, s3://; --cache-dir keeps remote ones);
            --dataset-resampled draws shards with replacement, weighted per source by
            --train-data-upsampling-factors, and --train-num-samples sets the epoch; otherwise
            every epoch reads every sample once in a shard order shared by all ranks,
            split_by_node giving every rank the same number of samples (sizes.json) and
            split_by_worker every DataLoader worker its part
  samples   tar members grouped into samples, a broken shard or sample skipped with a warning;
            a seeded sample shuffle buffer; samples without image or caption dropped
  decode    "pilrgb", then rename to image/text, map_dict(image transform, tokenizer),
            to_tuple, batched (full batches only), with_epoch in resampled mode
  loader    WebLoader with --workers DataLoader workers, or --subprocess-loader (the whole
            pipeline in one helper process, batches through shared memory), then
            DevicePrefetcher (pinned memory and a side CUDA stream on a GPU; a prefetching
            thread on the CPU)

Every --save-every steps rank 0 writes OUTPUT_DIR/checkpoints/latest.pt with the model, the optimizer,
the samples seen so far and every rank's loader state (wds.gather_states): --resume continues
the epoch exactly where it stopped, on the same or another number of ranks and workers. The
log says samples/s, step time and the fraction of step time spent waiting for data; at the end
of each epoch, rank 0 measures zero-shot retrieval (image->text and text->image, top-1 and
top-5) on the held-out shard. The models are deliberately tiny (a 3-layer CNN and a 1-layer
transformer over hashed words) so that this runs on a laptop CPU: swap in open_clip's models
and tokenizer for a real run; the data path stays the same.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import warnings
import zlib

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import shardstream as wds  # noqa: E402  (drop-in for `import webdataset as wds`)

# ---------------------------------------------------------------------------------------------
# Data: per-sample functions (module level, so that --subprocess-loader can pickle them)
# ---------------------------------------------------------------------------------------------


class ImageTransform:
    """PIL image -> normalised float tensor (3, size, size). No crops or colour jitter here:
    the captions name colours and positions."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, image) -> torch.Tensor:
        from PIL import Image

        array = np.asarray(image.resize((self.size, self.size), Image.BILINEAR), dtype=np.float32)
        return torch.from_numpy((array / 127.5 - 1.0).transpose(2, 0, 1).copy())


class Tokenizer:
    """Words hashed into `vocab` buckets (crc32: the same in every process), between start and
    end tokens, padded with 0 to `context` tokens. Stands in for open_clip.get_tokenizer(...)."""

    def __init__(self, context: int = 24, vocab: int = 4096) -> None:
        self.context, self.vocab = context, vocab

    def __call__(self, text: str) -> torch.Tensor:
        words = "".join(c if c.isalnum() else " " for c in text.lower()).split()
        ids = [1] + [3 + zlib.crc32(w.encode()) % (self.vocab - 3) for w in words][: self.context - 2] + [2]
        return torch.tensor(ids + [0] * (self.context - len(ids)), dtype=torch.long)


def has_caption_and_image(sample: dict) -> bool:
    return "txt" in sample and any(ext in sample for ext in ("jpg", "png", "jpeg", "webp"))


def source_sizes(spec: str) -> list:
    """Sample count per `::` source, from the sizes.json beside its shards (None where unknown)."""
    counts = []
    for part in spec.split("::"):
        urls = [url.split("?", 1)[0] for url in wds.shardlists.expand_urls(part)]  # (signed URLs)
        try:
            with wds.gopen(os.path.join(os.path.dirname(urls[0]), "sizes.json")) as stream:
                sizes = json.load(stream)
            counts.append(sum(sizes[os.path.basename(url)] for url in urls))
        except Exception:
            counts.append(None)
    return counts


def make_train_loader(args: argparse.Namespace, world_size: int):
    """OpenCLIP's webdataset pipeline; returns the loader and its samples per epoch (all ranks)."""
    counts = source_sizes(args.train_data)
    weights = None
    if args.dataset_resampled:
        if not args.train_num_samples:
            raise SystemExit("--dataset-resampled needs --train-num-samples (an epoch has no end otherwise)")
        samples_per_epoch = args.train_num_samples
        if args.train_data_upsampling_factors:
            # OpenCLIP's factor multiplies how often a source's samples come up; shardstream's
            # weights are the sources' shares of all samples: share = factor x source size
            # (its number of shards where no sizes.json says how many samples it has)
            factors = [float(f) for f in args.train_data_upsampling_factors.split("::")]
            sizes = [n if n is not None else len(wds.shardlists.expand_urls(part))
                     for n, part in zip(counts, args.train_data.split("::"))]
            weights = [f * n for f, n in zip(factors, sizes)]
    else:
        if args.train_data_upsampling_factors:
            raise SystemExit("--train-data-upsampling-factors needs --dataset-resampled (OpenCLIP's rule)")
        total = sum(counts) if None not in counts else None
        if args.train_num_samples and total is not None and args.train_num_samples > total:
            raise SystemExit(f"--train-num-samples {args.train_num_samples} is more than the {total} samples of the "
                             "shards: an epoch reads each sample once here (--dataset-resampled draws any number)")
        # (fewer than the shards hold: each epoch ends there, the Trainer's `epoch_end`)
        samples_per_epoch = args.train_num_samples or total
        if samples_per_epoch is None:
            raise SystemExit("no sizes.json beside the shards: pass --train-num-samples or run `shardstream index`")
    if args.cache_dir:
        os.makedirs(args.cache_dir, exist_ok=True)
    dataset = wds.WebDataset(
        args.train_data,
        resampled=args.dataset_resampled,
        weights=weights,  # per `::` source, with --dataset-resampled
        seed=args.seed,  # the same on every rank: one shard order per epoch, seeded sample shuffles
        shardshuffle=False if args.dataset_resampled else 100,
        # resampled: every rank and worker draws its own shards (seeded by rank and worker);
        # otherwise equal samples per rank (sizes.json), then per worker
        nodesplitter=None if args.dataset_resampled else wds.split_by_node,
        workersplitter=None if args.dataset_resampled else wds.split_by_worker,
        cache_dir=args.cache_dir,
        handler=wds.warn_and_continue,  # a corrupt shard or member: warn, keep the samples around it
    )
    dataset = (
        dataset.shuffle(args.shuffle_buffer, initial=args.shuffle_buffer // 4)  # seeded by (seed, epoch, rank, worker)
        .select(has_caption_and_image)
        .decode("pilrgb", handler=wds.warn_and_continue)
        .rename(image="jpg;png;jpeg;webp", text="txt")
        .map_dict(image=ImageTransform(args.image_size), text=Tokenizer(args.context_length))
        .to_tuple("image", "text", "__key__")
        .batched(args.batch_size, partial=False)
    )
    if args.dataset_resampled:  # OpenCLIP's epoch: the same number of batches from every worker
        workers = 1 if args.subprocess_loader else max(1, args.workers)  # (the helper is one process)
        per_worker = math.ceil(samples_per_epoch / (args.batch_size * world_size * workers))
        dataset = dataset.with_epoch(per_worker)
        samples_per_epoch = per_worker * args.batch_size * world_size * workers  # (whole batches: OpenCLIP's count)
    if args.subprocess_loader:
        if not hasattr(wds, "SubprocessLoader"):
            raise SystemExit("--subprocess-loader needs a shardstream with SubprocessLoader")
        loader = wds.WebLoader(dataset, batch_size=None, subprocess=True)
    else:
        loader = wds.WebLoader(dataset, batch_size=None, num_workers=args.workers)
    return loader, samples_per_epoch


def load_eval_set(url: str, args: argparse.Namespace):
    """The held-out shard as tensors, in shard order: images, tokens, captions."""
    dataset = (
        wds.WebDataset(url, shardshuffle=False, nodesplitter=None, workersplitter=None)  # all of it, on rank 0
        .select(has_caption_and_image)
        .decode("pilrgb")
        .rename(image="jpg;png;jpeg;webp", text="txt")
        .to_tuple("image", "text")
    )
    transform, tokenize = ImageTransform(args.image_size), Tokenizer(args.context_length)
    images, tokens, captions = [], [], []
    for image, text in dataset:
        images.append(transform(image))
        tokens.append(tokenize(text))
        captions.append(text)
    return torch.stack(images), torch.stack(tokens), captions


# ---------------------------------------------------------------------------------------------
# Model and loss
# ---------------------------------------------------------------------------------------------


class ImageEncoder(nn.Module):
    """Three strided convolutions, then a linear layer over the whole feature map (a pooled one
    would forget where things are, which the captions say)."""

    def __init__(self, size: int, dim: int, width: int = 32) -> None:
        super().__init__()
        layers, channels = [], 3
        for out, stride in ((width, 2), (2 * width, 2), (4 * width, 2)):
            layers += [nn.Conv2d(channels, out, 3, stride, 1), nn.GELU()]
            channels = out
        self.features = nn.Sequential(*layers)
        self.project = nn.Linear(channels * math.ceil(size / 8) ** 2, dim)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.project(self.features(images).flatten(1))


class TextEncoder(nn.Module):
    """Token and position embeddings, one transformer layer, the end token's output (CLIP's)."""

    def __init__(self, vocab: int, context: int, dim: int, width: int = 128) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Parameter(torch.randn(context, width) * 0.02)
        self.layer = nn.TransformerEncoderLayer(width, 4, 2 * width, dropout=0.0, batch_first=True, norm_first=True)
        self.norm = nn.LayerNorm(width)
        self.project = nn.Linear(width, dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.layer(self.tokens(tokens) + self.positions, src_key_padding_mask=tokens == 0)
        end = x[torch.arange(len(tokens)), (tokens == 2).int().argmax(dim=1)]
        return self.project(self.norm(end))


class TinyClip(nn.Module):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.image = ImageEncoder(args.image_size, args.embed_dim)
        self.text = TextEncoder(Tokenizer().vocab, args.context_length, args.embed_dim)
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def forward(self, images: torch.Tensor, tokens: torch.Tensor):
        return F.normalize(self.image(images), dim=-1), F.normalize(self.text(tokens), dim=-1), self.logit_scale.exp()


def clip_loss(image_features, text_features, logit_scale, rank: int, world_size: int) -> torch.Tensor:
    """Symmetric contrastive loss over the global batch (OpenCLIP's ClipLoss defaults): every
    rank gathers all features without gradients and puts its own back with theirs, so its
    gradient is the global loss's through its own samples, and DDP's average is the whole."""
    if world_size > 1:
        gathered = []
        for local in (image_features, text_features):
            parts = [torch.empty_like(local) for _ in range(world_size)]
            dist.all_gather(parts, local.detach())
            parts[rank] = local  # this rank's slot keeps its gradient
            gathered.append(torch.cat(parts))
        image_features, text_features = gathered
    logits = logit_scale * image_features @ text_features.t()
    labels = torch.arange(len(logits), device=logits.device)
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2


@torch.no_grad()
def retrieval_metrics(model: TinyClip, images, tokens, batch: int = 256) -> dict:
    """Zero-shot retrieval on the held-out pairs: is the true caption (image) among the top k?"""
    was_training, device = model.training, model.logit_scale.device
    model.eval()
    pairs = [model(images[i:i + batch].to(device), tokens[i:i + batch].to(device)) for i in range(0, len(images), batch)]
    model.train(was_training)
    a, b = torch.cat([p[0] for p in pairs]).cpu(), torch.cat([p[1] for p in pairs]).cpu()
    similarity = a @ b.t()
    truth = torch.arange(len(a))
    metrics = {"n": len(a), "chance_top1": round(1 / len(a), 4)}
    for name, scores in (("image_to_text", similarity), ("text_to_image", similarity.t())):
        rank_of_truth = (scores > scores[truth, truth][:, None]).sum(dim=1)  # how many score higher
        for k in (1, 5):
            metrics[f"{name}_top{k}"] = round(float((rank_of_truth < k).float().mean()), 4)
    return metrics


# ---------------------------------------------------------------------------------------------
# Learning rate, loss plot
# ---------------------------------------------------------------------------------------------


def learning_rate(args: argparse.Namespace, seen: int, total: int) -> float:
    """Linear warmup, then cosine decay, by samples seen (so that it survives a new world size)."""
    warmup = args.warmup * total
    if seen < warmup:
        return args.lr * (seen + 1) / warmup
    return 0.5 * args.lr * (1 + math.cos(math.pi * min(1.0, (seen - warmup) / max(1, total - warmup))))


def plot_losses(records: list, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        warnings.warn("matplotlib is not installed: no loss plot")
        return
    steps = [r for r in records if "loss" in r]
    evals = [r for r in records if "image_to_text_top1" in r]
    fig, ax = plt.subplots(figsize=(7, 4))
    lines = ax.plot([r["samples_seen"] for r in steps], [r["loss"] for r in steps], lw=1, label="training loss")
    ax.set_xlabel("samples seen (all ranks)")
    ax.set_ylabel("contrastive loss")
    if evals:
        right = ax.twinx()
        for key, style in (("image_to_text_top1", "o-"), ("text_to_image_top1", "s--")):
            lines += right.plot([r["samples_seen"] for r in evals], [r[key] for r in evals], style, color="tab:red",
                                label=f"{key.replace('_', ' ').replace('top1', 'top-1')} (held out)")
        right.set_ylabel(f"retrieval top-1 among N={evals[-1]['n']} (chance {1 / evals[-1]['n']:.1%})")
        right.set_ylim(0, 1)
    ax.legend(lines, [line.get_label() for line in lines], loc="upper center")
    ax.set_title("tools/train_clip.py")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train-data", required=True, help="shard spec; '::' separates sources")
    p.add_argument("--train-data-upsampling-factors", default=None, help="e.g. '1::4' (with --dataset-resampled)")
    p.add_argument("--dataset-resampled", action="store_true", help="draw shards with replacement")
    p.add_argument("--train-num-samples", type=int, default=None,
                   help="samples per epoch, all ranks (default: sizes.json; without --dataset-resampled at most that)")
    p.add_argument("--val-data", default=None, help="held-out shard(s) for zero-shot retrieval")
    p.add_argument("--cache-dir", default=None, help="keep remote shards on local disk")
    p.add_argument("--workers", type=int, default=1, help="DataLoader workers per rank")
    p.add_argument("--subprocess-loader", action="store_true", help="the pipeline in one helper process per rank")
    p.add_argument("--batch-size", type=int, default=128, help="per rank")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=float, default=0.05, help="fraction of training")
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--context-length", type=int, default=24)
    p.add_argument("--embed-dim", type=int, default=128)
    p.add_argument("--shuffle-buffer", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--output-dir", default="logs/train_clip", help="metrics.jsonl, checkpoints/, loss.png")
    p.add_argument("--log-every", type=int, default=10, help="steps")
    p.add_argument("--save-every", type=int, default=100, help="steps between checkpoints (0: epoch ends only)")
    p.add_argument("--resume", default=None, help="a checkpoint, or 'latest' (OUTPUT_DIR/checkpoints/latest.pt)")
    p.add_argument("--stop-at-step", type=int, default=None, help="save a checkpoint at this step and exit")
    p.add_argument("--log-keys", default=None, help="PREFIX: each rank writes the keys it trains on to PREFIX.rankN.jsonl")
    return p.parse_args(argv)


class Trainer:
    """One rank's training run: model, optimizer, loader, counters, checkpoints and logs."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.distributed = int(os.environ.get("WORLD_SIZE", 1)) > 1
        if self.distributed:
            dist.init_process_group("nccl" if args.device.startswith("cuda") else "gloo")
        self.rank, self.world_size = (dist.get_rank(), dist.get_world_size()) if self.distributed else (0, 1)
        self.device = torch.device(args.device)
        if self.device.type == "cuda":
            self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
            torch.cuda.set_device(self.device)
        torch.manual_seed(args.seed)  # the same initial model on every rank

        self.loader, self.samples_per_epoch = make_train_loader(args, self.world_size)
        self.model = TinyClip(args).to(self.device)
        self.ddp = nn.parallel.DistributedDataParallel(
            self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None
        ) if self.distributed else self.model
        decay = [p for n, p in self.model.named_parameters() if p.ndim >= 2 and "positions" not in n]
        rest = [p for n, p in self.model.named_parameters() if not (p.ndim >= 2 and "positions" not in n)]
        self.optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                                            {"params": rest, "weight_decay": 0.0}], lr=args.lr)
        self.epoch, self.step, self.seen = 0, 0, 0  # seen: samples, all ranks together
        self.resumed_mid_epoch = False
        self.epoch_start = 0  # samples seen when the current epoch began: it ends samples_per_epoch later
        self.batches = None  # the current epoch's DevicePrefetcher: its state_dict is the loader's
        self.checkpoint_path = os.path.join(args.output_dir, "checkpoints", "latest.pt")
        self.totals = {"wait": 0.0, "time": 0.0, "samples": 0}
        os.makedirs(args.output_dir, exist_ok=True)
        self.metrics = open(os.path.join(args.output_dir, "metrics.jsonl"), "a") if self.rank == 0 else None
        self.keys = open(f"{args.log_keys}.rank{self.rank}.jsonl", "a") if args.log_keys else None
        self.eval_set = load_eval_set(args.val_data, args) if args.val_data and self.rank == 0 else None

    def log(self, record: dict) -> None:
        if self.metrics is not None:
            line = json.dumps(record)
            print(line, flush=True)
            self.metrics.write(line + "\n")
            self.metrics.flush()

    def resume(self, path: str) -> None:
        state = torch.load(path, map_location="cpu", weights_only=False)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.epoch, self.step, self.seen = state["epoch"], state["step"], state["samples_seen"]
        if state["loader"] is not None:  # mid-epoch: every saved rank's loader state
            self.loader.set_epoch(self.epoch)
            # (checkpoints before epoch_start was saved: every epoch before this one was whole)
            self.epoch_start = state.get("epoch_start", self.epoch * self.samples_per_epoch)
            self.resumed_mid_epoch = True
            if len(state["loader"]) != self.world_size and self.args.dataset_resampled:
                # draws with replacement have no "samples left" to share out on a new layout:
                # draw the rest of the epoch afresh, up to the epoch's number of samples
                warnings.warn("resampled data on another number of ranks: the rest of the epoch is drawn afresh")
            else:  # the same layout, or any other one (split_by_node shares out what is left)
                self.loader.load_state_dict(state["loader"])
        if self.rank == 0:
            where = f"mid-epoch (saved on {len(state['loader'])} ranks)" if state["loader"] else "at an epoch start"
            print(f"resumed from {path}: epoch {self.epoch}, step {self.step}, {where}", flush=True)

    def save(self, mid_epoch: bool) -> None:
        # every rank's loader state (a collective: all ranks call it at the same step), so that
        # the run can go on with another number of ranks or workers too
        loader_states = wds.gather_states(self.batches.state_dict()) if mid_epoch else None
        if self.rank == 0:
            os.makedirs(os.path.dirname(self.checkpoint_path), exist_ok=True)
            torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                        "loader": loader_states, "epoch": self.epoch if mid_epoch else self.epoch + 1,
                        "step": self.step, "samples_seen": self.seen, "epoch_start": self.epoch_start,
                        "world_size": self.world_size,
                        "args": vars(self.args)}, self.checkpoint_path + ".tmp")
            os.replace(self.checkpoint_path + ".tmp", self.checkpoint_path)  # never half a checkpoint

    def next_batch(self, iterator):
        """The next batch, or None when this epoch is over on any rank (DDP needs every rank to
        run every step: a rank whose bad samples were skipped may run out one batch early)."""
        batch = next(iterator, None)
        if self.seen >= self.epoch_start + self.samples_per_epoch:  # (--train-num-samples ends it early)
            batch = None
        if self.distributed:
            more = torch.tensor([batch is not None], dtype=torch.int32, device=self.device)  # (nccl: on the GPU)
            dist.all_reduce(more, op=dist.ReduceOp.MIN)
            return batch if more.item() else None
        return batch

    def train_step(self, images, tokens) -> float:
        args = self.args
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(args, self.seen, self.samples_per_epoch * args.epochs)
        image_features, text_features, scale = self.ddp(images, tokens)
        loss = clip_loss(image_features, text_features, scale, self.rank, self.world_size)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        with torch.no_grad():
            self.model.logit_scale.clamp_(0, math.log(100))
        self.step += 1
        self.seen += len(images) * self.world_size
        return float(loss.detach())

    def train_epoch(self) -> bool:
        """One epoch (or the rest of a resumed one); False when stopped by --stop-at-step."""
        args = self.args
        if not self.resumed_mid_epoch:
            self.loader.set_epoch(self.epoch)  # a new shard order, the same on every rank
            self.epoch_start = self.seen
        self.resumed_mid_epoch = False
        self.batches = wds.DevicePrefetcher(self.loader, device=self.device, depth=2)
        iterator = iter(self.batches)
        window = {"wait": 0.0, "time": 0.0, "loss": 0.0, "steps": 0}
        while True:
            started = time.perf_counter()
            batch = self.next_batch(iterator)
            waited = time.perf_counter() - started
            if batch is None:
                break
            images, tokens, keys = batch
            loss = self.train_step(images, tokens)
            elapsed = time.perf_counter() - started
            if self.keys is not None:
                self.keys.write(json.dumps({"epoch": self.epoch, "step": self.step, "loss": loss, "keys": list(keys)}) + "\n")
                self.keys.flush()
            for counter, value in (("wait", waited), ("time", elapsed)):
                window[counter] += value
                self.totals[counter] += value
            window["loss"] += loss
            window["steps"] += 1
            self.totals["samples"] += len(images) * self.world_size
            if self.step % args.log_every == 0:
                self.log({"epoch": self.epoch, "step": self.step, "samples_seen": self.seen,
                          "loss": round(window["loss"] / window["steps"], 4),
                          "lr": round(self.optimizer.param_groups[0]["lr"], 6),
                          "logit_scale": round(self.model.logit_scale.exp().item(), 2),
                          "step_ms": round(1000 * window["time"] / window["steps"], 1),
                          "data_wait": round(window["wait"] / window["time"], 3),
                          "samples_per_s": round(window["steps"] * len(images) * self.world_size / window["time"], 1)})
                window = {"wait": 0.0, "time": 0.0, "loss": 0.0, "steps": 0}
            stop = args.stop_at_step is not None and self.step >= args.stop_at_step
            if stop or (args.save_every and self.step % args.save_every == 0):
                self.save(mid_epoch=True)
            if stop:
                iterator.close()
                if self.rank == 0:
                    print(f"stopped at step {self.step}; go on with --resume {self.checkpoint_path}", flush=True)
                return False
        iterator.close()
        self.save(mid_epoch=False)
        if self.eval_set is not None:
            self.log({"epoch": self.epoch, "step": self.step, "samples_seen": self.seen,
                      **retrieval_metrics(self.model, *self.eval_set[:2])})
        self.epoch += 1
        return True

    def finish(self) -> None:
        if self.rank == 0:
            time_s = max(self.totals["time"], 1e-9)
            summary = {"steps": self.step, "samples_seen": self.seen, "world_size": self.world_size,
                       "samples_per_s": round(self.totals["samples"] / time_s, 1),
                       "data_wait": round(self.totals["wait"] / time_s, 3)}
            if self.eval_set is not None:
                summary.update(retrieval_metrics(self.model, *self.eval_set[:2]))
            print(json.dumps({"summary": summary}), flush=True)
            with open(os.path.join(self.args.output_dir, "summary.json"), "w") as f:
                json.dump(summary, f, indent=1)
            with open(os.path.join(self.args.output_dir, "metrics.jsonl")) as f:
                plot_losses([json.loads(line) for line in f], os.path.join(self.args.output_dir, "loss.png"))


def main(argv=None) -> None:
    args = parse_args(argv)
    trainer = Trainer(args)
    if args.resume:
        trainer.resume(trainer.checkpoint_path if args.resume == "latest" else args.resume)
    completed = True
    while completed and trainer.epoch < args.epochs:
        completed = trainer.train_epoch()
    if completed:
        trainer.finish()
    if trainer.distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
