"""Test helpers: tiny on-disk image datasets in the layouts users have (ImageFolder, torchvision MNIST/CIFAR,
caption CSV), running an experiment through Hydra's compose API, and a CPU-sized CLIP with fixed batches."""

from __future__ import annotations

import math
import pickle
import struct
from pathlib import Path

import lightning as L
import numpy as np
import torch
from hydra import compose, initialize_config_module
from PIL import Image
from torch.utils.data import DataLoader

from lit_transformers.models import CLIPConfig
from lit_transformers.tasks import ContrastiveTask
from lit_transformers.train import train


def write_image_folder(root: Path, classes=("cat", "dog", "fox"), per_class: int = 4, size: int = 16) -> Path:
    """root/<class>/<i>.png with a class-dependent colour, so a classifier could tell them apart."""
    rng = np.random.default_rng(0)
    for c, name in enumerate(classes):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            pixels = rng.integers(0, 60, (size, size, 3)) + 60 * c
            Image.fromarray(pixels.astype(np.uint8)).save(root / name / f"{i}.png")
    return root


def write_fake_mnist(root: Path, n_train: int = 40, n_test: int = 20) -> Path:
    """root/MNIST/raw/*-ubyte in the IDX format torchvision reads (what download=true leaves behind)."""
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(
            struct.pack(">iiii", 2051, n, 28, 28) + rng.integers(0, 256, n * 784).astype(np.uint8).tobytes()
        )
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(
            struct.pack(">ii", 2049, n) + (np.arange(n) % 10).astype(np.uint8).tobytes()
        )
    return root


def write_fake_cifar10(root: Path, per_batch: int = 20) -> Path:
    """root/cifar-10-batches-py pickles as torchvision expects (its md5 check must be patched out)."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {
            "data": rng.integers(0, 256, (per_batch, 3072)).astype(np.uint8),
            "labels": list(np.arange(per_batch) % 10),
        }
        (folder / name).write_bytes(pickle.dumps(batch))
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": names}))
    return root


def write_caption_csv(root: Path, n_images: int = 12, captions_per_image: int = 2, size: int = 32) -> Path:
    """root/images/*.png and root/pairs.csv with several captions per image."""
    write_image_folder(root / "images", classes=("all",), per_class=n_images, size=size)
    lines = ["image,caption"] + [
        f"images/all/{i}.png,picture {i} caption {j}"
        for i in range(n_images)
        for j in range(captions_per_image)
    ]
    (root / "pairs.csv").write_text("\n".join(lines) + "\n")
    return root / "pairs.csv"


def run_experiment(tmp_path: Path, overrides: list[str]) -> dict[str, float]:
    """Compose ``train.yaml`` with the overrides and run ``train``; the run folder is ``tmp_path``."""
    with initialize_config_module("lit_transformers.conf", version_base="1.3"):
        cfg = compose("train", overrides=[f"paths.output_dir={tmp_path}", *overrides])
    return train(cfg).metrics


def tiny_clip_task(init_logit_scale: float = math.log(1 / 0.07), **task_kwargs) -> ContrastiveTask:
    """A CLIP small enough for CPU tests: 8x8 grayscale images, 1-block towers, no dropout or drop-path."""
    image = {
        "name": "vit_tiny_patch16_224",
        "img_size": 8,
        "patch_size": 4,
        "in_chans": 1,
        "embed_dim": 32,
        "depth": 1,
        "num_heads": 2,
    }
    config = CLIPConfig(
        image=image,
        embed_dim=16,
        vocab_size=64,
        eos_id=2,
        context_length=8,
        text_width=32,
        text_layers=1,
        text_heads=2,
        init_logit_scale=init_logit_scale,
    )
    task_kwargs.setdefault("optimizer", {"_target_": "torch.optim.AdamW", "lr": 1e-3, "weight_decay": 0.1})
    return ContrastiveTask(model=config, **task_kwargs)


def fixed_caption_batch(n: int = 8, seed: int = 0) -> dict[str, torch.Tensor]:
    """n images with captions of random lengths, each ending in EOS (id 2) and padded with 0."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.zeros(n, 8, dtype=torch.long)
    for row in range(n):
        length = int(torch.randint(1, 7, (1,), generator=g))
        ids[row, :length] = torch.randint(3, 64, (length,), generator=g)
        ids[row, length] = 2
    return {
        "image": torch.randn(n, 1, 8, 8, generator=g),
        "input_ids": ids,
        "image_index": torch.arange(n),
        "label": torch.full((n,), -1),
    }


class FixedBatches(L.LightningDataModule):
    """Every training step sees the same batch; under DDP each rank takes its own contiguous rows of it."""

    def __init__(self, batch: dict[str, torch.Tensor]):
        super().__init__()
        self.batch = batch

    def train_dataloader(self):
        rank, world = self.trainer.global_rank, self.trainer.world_size
        rows = len(self.batch["image"]) // world
        shard = {k: v[rank * rows : (rank + 1) * rows] for k, v in self.batch.items()}
        return DataLoader([shard] * 4, batch_size=None)  # batch_size=None: items are already batches
