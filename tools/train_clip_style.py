"""An OpenCLIP-style training loop on shardstream: image-text shards, a webdataset pipeline
written the way OpenCLIP writes it, DDP when launched by torchrun, a stateful loader with
checkpoints, and the device prefetcher.

    python tools/train_clip_style.py "demo-data/demo-{000000..000007}.tar" --epochs 2
    torchrun --nproc_per_node=2 tools/train_clip_style.py "demo-data/demo-{000000..000007}.tar"

The model is deliberately tiny (a linear image tower on 32x32 thumbnails, a bag-of-bytes text
tower): the point is the data path, which is the one a real CLIP run uses.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

import shardstream as wds


def preprocess_image(image) -> torch.Tensor:
    thumb = image.convert("RGB").resize((32, 32))
    return torch.from_numpy(np.asarray(thumb, dtype=np.float32) / 255.0).permute(2, 0, 1)


def tokenize(text: str, length: int = 32) -> torch.Tensor:
    codes = list(text.encode("utf-8")[:length])
    return torch.tensor(codes + [0] * (length - len(codes)), dtype=torch.long)


def has_caption_and_image(sample) -> bool:
    return "txt" in sample and ("jpg" in sample or "png" in sample)


class TinyClip(torch.nn.Module):
    def __init__(self, dim: int = 64) -> None:
        super().__init__()
        self.image = torch.nn.Linear(3 * 32 * 32, dim)
        self.text = torch.nn.EmbeddingBag(256, dim)
        self.logit_scale = torch.nn.Parameter(torch.tensor(2.659))

    def forward(self, images, texts):
        a = F.normalize(self.image(images.flatten(1)), dim=-1)
        b = F.normalize(self.text(texts), dim=-1)
        logits = self.logit_scale.exp() * a @ b.t()
        target = torch.arange(len(images), device=images.device)
        return (F.cross_entropy(logits, target) + F.cross_entropy(logits.t(), target)) / 2


def make_loader(urls: str, batch_size: int, workers: int, seed: int):
    dataset = wds.DataPipeline(
        wds.SimpleShardList(urls),
        wds.split_by_node,  # equal samples per rank (shardstream's scheduler)
        wds.split_by_worker,
        wds.tarfile_to_samples(handler=wds.warn_and_continue),
        wds.shuffle(bufsize=256, initial=64, seed=seed),
        wds.select(has_caption_and_image),
        wds.decode("pilrgb", handler=wds.warn_and_continue),
        wds.rename(image="jpg;png", text="txt"),
        wds.map_dict(image=preprocess_image, text=tokenize),
        wds.to_tuple("image", "text"),
        wds.batched(batch_size, partial=False),
    )
    return wds.WebLoader(dataset, batch_size=None, num_workers=workers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("urls")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", default=None, help="save/resume the loader and model here")
    args = parser.parse_args()

    distributed = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if torch.cuda.is_available() else torch.device("cpu")

    model = TinyClip().to(device)
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = make_loader(args.urls, args.batch_size, args.workers, args.seed)

    start_epoch = 0
    # DDP keeps the model identical on every rank, and the loader state holds every rank's: a
    # rank the saved run did not have (more ranks now) starts from rank 0's file
    saved = next((f"{args.checkpoint}.rank{r}" for r in (rank, 0) if args.checkpoint and os.path.exists(f"{args.checkpoint}.rank{r}")), None)
    if saved is not None:
        state = torch.load(saved, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["loader"])
        start_epoch = state["epoch"]

    for epoch in range(start_epoch, args.epochs):
        loader.set_epoch(epoch)
        start, samples, steps = time.perf_counter(), 0, 0
        batches = wds.DevicePrefetcher(loader, device=device)  # runs ahead: checkpoint its state, not the loader's
        for images, texts in batches:
            loss = model(images, texts)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            samples += len(images)
            steps += 1
            if args.checkpoint and steps % 10 == 0:
                # every rank's loader state (a collective, at the same step on all ranks): the
                # run can then be resumed on another number of ranks or workers too
                loaders = wds.gather_states(batches.state_dict())
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "loader": loaders, "epoch": epoch}, f"{args.checkpoint}.rank{rank}")
        elapsed = time.perf_counter() - start
        print(json.dumps({"rank": rank, "epoch": epoch, "steps": steps, "samples": samples,
                          "samples_per_s": round(samples / elapsed, 1), "loss": round(float(loss.detach()), 4)}))
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
