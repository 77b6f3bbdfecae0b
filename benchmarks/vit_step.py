"""Images/s of our Lightning ViT training step vs a plain timm + PyTorch loop on the same model and data.

    python benchmarks/vit_step.py                       # CPU, a ViT-Ti-sized model at 32x32
    python benchmarks/vit_step.py --steps 200 --batch-size 256 --img-size 224 --patch-size 16   # on a GPU

Both sides do the same work per step: forward, label-smoothed cross-entropy, backward, grad clipping at 1.0,
AdamW with the same parameter groups, warmup + cosine. Each run times its steps after its warm-up; runs come
in rounds (``timing.quiet_rounds``: rotating order, busy rounds discarded and counted) and the best of each is
compared, so drift in machine load affects both alike. The ratio is printed, never asserted.
"""

from __future__ import annotations

import argparse
import time

import lightning as L
import torch
import torch.nn.functional as F
from timing import add_round_args, kept_note, quiet_rounds
from torch.utils.data import DataLoader, TensorDataset

from lit_transformers.models import create_backbone
from lit_transformers.tasks import ImageClassificationTask, decay_groups, warmup_cosine

N_CLASSES = 10


def backbone(args) -> dict:
    return {
        "name": "vit_tiny_patch16_224",
        "img_size": args.img_size,
        "patch_size": args.patch_size,
        "depth": args.depth,
    }


def loader(args) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    n = args.batch_size * 8
    data = TensorDataset(
        torch.randn(n, 3, args.img_size, args.img_size, generator=g),
        torch.randint(0, N_CLASSES, (n,), generator=g),
    )
    return DataLoader(
        data, batch_size=args.batch_size, shuffle=True, drop_last=True, pin_memory=args.device == "cuda"
    )


def plain(args) -> float:
    """Seconds for ``args.steps`` timed steps of a hand-written loop."""
    torch.manual_seed(0)
    model = create_backbone(**backbone(args), num_classes=N_CLASSES).to(args.device)
    optimizer = torch.optim.AdamW(
        decay_groups(model, set(model.no_weight_decay())), lr=1e-3, weight_decay=0.05
    )
    scheduler = warmup_cosine(optimizer, args.warmup + args.steps, warmup_steps=10)
    data, step, start = loader(args), 0, 0.0
    while step < args.warmup + args.steps:
        for images, labels in data:
            if step == args.warmup:
                _sync(args)
                start = time.perf_counter()
            images, labels = (
                images.to(args.device, non_blocking=True),
                labels.to(args.device, non_blocking=True),
            )
            loss = F.cross_entropy(model(images).float(), labels, label_smoothing=0.1)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            step += 1
            if step == args.warmup + args.steps:
                break
    _sync(args)
    return time.perf_counter() - start


class Timer(L.Callback):
    def __init__(self, warmup: int):
        self.warmup, self.start, self.end = warmup, 0.0, 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.warmup:
            torch.cuda.synchronize() if torch.cuda.is_available() else None
            self.start = time.perf_counter()

    def on_train_end(self, trainer, pl_module):
        torch.cuda.synchronize() if torch.cuda.is_available() else None
        self.end = time.perf_counter()


class Synthetic(L.LightningDataModule):
    def __init__(self, args):
        super().__init__()
        self.args, self.class_names = args, [str(i) for i in range(N_CLASSES)]

    def train_dataloader(self) -> DataLoader:
        return loader(self.args)


def ours(args) -> float:
    """Seconds for the same timed steps through ImageClassificationTask and the Lightning Trainer."""
    torch.manual_seed(0)
    task = ImageClassificationTask(
        model={"backbone": backbone(args)},
        optimizer={"_target_": "torch.optim.AdamW", "lr": 1e-3, "weight_decay": 0.05},
        scheduler={"_target_": "lit_transformers.tasks.warmup_cosine", "warmup_steps": 10},
        label_smoothing=0.1,
    )
    timer = Timer(args.warmup)
    trainer = L.Trainer(
        accelerator="gpu" if args.device == "cuda" else "cpu",
        devices=1,
        max_steps=args.warmup + args.steps,
        gradient_clip_val=1.0,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[timer],
    )
    trainer.fit(task, datamodule=Synthetic(args))
    return timer.end - timer.start


def _sync(args) -> None:
    if args.device == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=30, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    add_round_args(parser, 3, 12, "--repeats")  # rounds of one run each; the best counts
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--img-size", type=int, default=32)
    parser.add_argument("--patch-size", type=int, default=4)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    times, busy = quiet_rounds(
        {"plain": lambda: plain(args), "ours": lambda: ours(args)}, args, self_timed=True
    )
    print(kept_note(times, busy))
    if not times["plain"]:
        return
    images = args.steps * args.batch_size
    best = {k: min(v) for k, v in times.items()}
    for name, seconds in best.items():
        print(
            f"{name:>5}: {images / seconds:8.1f} images/s  "
            f"(best of {len(times[name])}: {seconds:.2f}s for {args.steps} steps)"
        )
    ratio = best["ours"] / best["plain"]
    print(f"ratio ours/plain step time: {ratio:.3f}  (overhead {100 * (ratio - 1):+.1f}%)")


if __name__ == "__main__":
    main()
