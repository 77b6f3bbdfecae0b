"""Where the images of classification (and CLIP's digit captions) come from, as ``(PIL image, class index)``
datasets split into train/val/test: scikit-learn's bundled digits, an ``ImageFolder`` tree (``root/{train,val}``
or one tree split stratified), torchvision's CIFAR-10/100 and MNIST (their test set; val split off train).
Transforms and the datamodule: :mod:`lit_transformers.data.images`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import Dataset, Subset
from torchvision import datasets

from lit_transformers.data.image_io import open_image

SOURCES = ("digits", "folder", "cifar10", "cifar100", "mnist")
TORCHVISION = {"cifar10": datasets.CIFAR10, "cifar100": datasets.CIFAR100, "mnist": datasets.MNIST}
DIGIT_NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


class Digits(Dataset):
    """scikit-learn's bundled 8x8 handwritten digits (values 0..16) as grayscale PIL images."""

    def __init__(self):
        bunch = load_digits()
        self.images = (bunch.images * (255 / 16)).round().astype(np.uint8)  # (1797, 8, 8)
        self.targets = bunch.target.tolist()
        self.classes = list(DIGIT_NAMES)

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int) -> tuple[Image.Image, int]:
        return Image.fromarray(self.images[i], mode="L"), self.targets[i]


def stratified_split(
    targets: Sequence[int],
    val_fraction: float,
    test_fraction: float,
    seed: int,
    splits=("train", "val", "test"),
) -> dict[str, list[int]]:
    """Indices per split, every class in the same proportion (sklearn ``train_test_split(stratify=...)``).
    ``test_fraction=1``: every index is the test split's (a run that trains nothing scores them all)."""
    index = np.arange(len(targets))
    targets = np.asarray(targets)
    held_out = val_fraction + test_fraction
    if test_fraction == 1:
        if val_fraction:
            raise ValueError(
                f"data.test_fraction=1 puts every image in the test split, leaving none for "
                f"data.val_fraction={val_fraction}; set data.val_fraction=0"
            )
        return {"train": [], "val": [], "test": index.tolist()}
    train, rest = train_test_split(index, test_size=held_out, stratify=targets, random_state=seed)
    if len(splits) == 2:
        return {splits[0]: sorted(train), splits[1]: sorted(rest)}
    val, test = train_test_split(
        rest, test_size=test_fraction / held_out, stratify=targets[rest], random_state=seed
    )
    return {"train": sorted(train), "val": sorted(val), "test": sorted(test)}


def _folder_splits(root: Path, val_fraction: float, test_fraction: float, seed: int):
    if not root.is_dir():
        raise FileNotFoundError(f"Image folder {root} not found; set data.root=<folder of class subfolders>")
    if not (root / "train").is_dir():  # one class-folder tree: split it
        full = datasets.ImageFolder(root, loader=open_image)
        parts = stratified_split(full.targets, val_fraction, test_fraction, seed)
        return {k: Subset(full, v) for k, v in parts.items()}, full.classes
    if not (root / "val").is_dir():
        raise FileNotFoundError(f"{root}/train exists but {root}/val does not; add a val/ folder")
    found = {
        s: datasets.ImageFolder(root / s, loader=open_image)
        for s in ("train", "val", "test")
        if (root / s).is_dir()
    }
    found.setdefault("test", found["val"])
    if found["val"].classes != found["train"].classes:
        raise ValueError(f"Class folders differ between {root}/train and {root}/val")
    return found, found["train"].classes


def _torchvision_splits(source: str, root: Path, download: bool, val_fraction: float, seed: int):
    try:
        train = TORCHVISION[source](root, train=True, download=download)
        test = TORCHVISION[source](root, train=False, download=download)
    except RuntimeError as err:
        raise FileNotFoundError(
            f"{source} not found under {root} ({err}); set data.download=true to fetch it"
        ) from err
    parts = stratified_split(train.targets, val_fraction, 0.0, seed, splits=("train", "val"))
    return {"train": Subset(train, parts["train"]), "val": Subset(train, parts["val"]), "test": test}, list(
        train.classes
    )


def load_image_splits(
    source: str,
    root: str | None = None,
    download: bool = False,
    val_fraction: float = 0.1,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> tuple[dict[str, Dataset], list[str]]:
    """``{"train", "val", "test"}`` datasets of (PIL image, label) and the class names.

    digits: stratified split. folder: ``root/{train,val[,test]}`` class folders (test falls back to val),
    or one class-folder tree that is split stratified. cifar10/cifar100/mnist: the official test set,
    with val split off train.
    """
    if source not in SOURCES:
        raise ValueError(f"Unknown image source {source!r}; choose one of {SOURCES}")
    if source == "digits":
        full = Digits()
        parts = stratified_split(full.targets, val_fraction, test_fraction, seed)
        return {k: Subset(full, v) for k, v in parts.items()}, full.classes
    if root is None:
        raise ValueError(f"data.root is required for source={source}; set data.root=/path/to/images")
    if source == "folder":
        return _folder_splits(Path(root).expanduser(), val_fraction, test_fraction, seed)
    return _torchvision_splits(source, Path(root).expanduser(), download, val_fraction, seed)
