"""Tiny on-disk image datasets in the layouts users have (ImageFolder, torchvision MNIST/CIFAR, caption CSV),
and a helper that runs an experiment through Hydra's compose API."""

from __future__ import annotations

import pickle
import struct
from pathlib import Path

import numpy as np
from hydra import compose, initialize_config_module
from PIL import Image

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
        batch = {"data": rng.integers(0, 256, (per_batch, 3072)).astype(np.uint8), "labels": list(np.arange(per_batch) % 10)}
        (folder / name).write_bytes(pickle.dumps(batch))
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": names}))
    return root


def write_caption_csv(root: Path, n_images: int = 12, captions_per_image: int = 2, size: int = 32) -> Path:
    """root/images/*.png and root/pairs.csv with several captions per image."""
    write_image_folder(root / "images", classes=("all",), per_class=n_images, size=size)
    lines = ["image,caption"] + [
        f"images/all/{i}.png,picture {i} caption {j}" for i in range(n_images) for j in range(captions_per_image)
    ]
    (root / "pairs.csv").write_text("\n".join(lines) + "\n")
    return root / "pairs.csv"


def run_experiment(tmp_path: Path, overrides: list[str]) -> dict[str, float]:
    """Compose ``train.yaml`` with the overrides and run ``train``; the run folder is ``tmp_path``."""
    with initialize_config_module("lit_transformers.conf", version_base="1.3"):
        cfg = compose("train", overrides=[f"paths.output_dir={tmp_path}", *overrides])
    return train(cfg)
