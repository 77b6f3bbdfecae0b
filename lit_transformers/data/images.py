"""Image transforms and loaders shared by ViT and CLIP, and the classification datamodule.

Every source (:mod:`lit_transformers.data.image_sources`) yields ``(PIL image, class index)`` pairs; a split's
transform is applied on top (``Transformed``), so one pipeline serves sklearn digits, an ``ImageFolder`` tree and
torchvision CIFAR/MNIST.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import lightning as L
import timm.data
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, default_collate
from torchvision import transforms

from lit_transformers.data.checks import check_batch_size
from lit_transformers.data.image_io import SkipUnreadable
from lit_transformers.data.image_sources import (
    TORCHVISION,
    load_image_splits,
    stratified_split,  # noqa: F401 (re-exported)
)
from lit_transformers.data.loaders import make_loader

log = logging.getLogger(__name__)


class Transformed(Dataset):
    """Applies a split's transform to an untransformed ``(image, label)`` dataset."""

    def __init__(self, dataset: Dataset, transform: Callable):
        self.dataset, self.transform = dataset, transform

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        image, label = self.dataset[i]
        return self.transform(image), label


class ToMode:
    """PIL ``convert`` as a picklable transform (DataLoader workers may be spawned)."""

    def __init__(self, mode: str):
        self.mode = mode

    def __call__(self, image: Image.Image) -> Image.Image:
        return image.convert(self.mode)


def build_transform(
    train: bool,
    img_size: int,
    in_chans: int = 3,
    mean: Sequence[float] = (0.485, 0.456, 0.406),
    std: Sequence[float] = (0.229, 0.224, 0.225),
    recipe: str = "small",
    **options,
) -> Callable:
    """PIL image -> normalised (in_chans, img_size, img_size) tensor.

    recipe=small: resize, plus a random affine jitter (``degrees``, ``translate``, ``scale``) when training;
    for tiny images such as 8x8 digits, where crops and flips would destroy the content.
    recipe=timm: ``timm.data.create_transform`` (RandomResizedCrop, flip, RandAugment via ``auto_augment``,
    random erasing via ``re_prob``; resize + center crop by ``crop_pct`` at eval), the DeiT pipeline.
    """
    if len(mean) != in_chans or len(std) != in_chans:
        raise ValueError(
            f"data.mean/std need {in_chans} values (one per channel), got {list(mean)} / {list(std)}"
        )
    mode = ToMode("RGB" if in_chans == 3 else "L")
    if recipe == "timm":
        return transforms.Compose(
            [
                mode,
                timm.data.create_transform(
                    img_size, is_training=train, mean=tuple(mean), std=tuple(std), **options
                ),
            ]
        )
    if recipe != "small":
        raise ValueError(f"Unknown transform recipe {recipe!r}; choose small or timm")
    steps = [mode, transforms.Resize((img_size, img_size), antialias=True)]
    if train:
        steps.append(
            transforms.RandomAffine(
                options.get("degrees", 0),
                options.get("translate"),
                options.get("scale"),
                interpolation=transforms.InterpolationMode.BILINEAR,
            )
        )
    return transforms.Compose([*steps, transforms.ToTensor(), transforms.Normalize(mean, std)])


class MixupCollate:
    """timm Mixup/CutMix on whole batches: labels become (B, num_classes) soft targets, smoothing included."""

    def __init__(self, mixup: timm.data.Mixup):
        self.mixup = mixup

    def __call__(self, batch):
        images, labels = default_collate(batch)
        return self.mixup(images, labels)


class ImageClassificationDataModule(L.LightningDataModule):
    def __init__(
        self,
        source: str = "digits",
        root: str | None = None,
        download: bool = False,
        img_size: int = 8,
        in_chans: int = 1,
        mean: Sequence[float] = (0.3,),
        std: Sequence[float] = (0.38,),
        transform: dict | None = None,
        mixup: dict | None = None,
        batch_size: int = 64,
        val_fraction: float = 0.1,
        test_fraction: float = 0.2,
        num_workers: int = 0,
        seed: int = 0,
    ):
        super().__init__()
        check_batch_size(batch_size)
        self.save_hyperparameters(logger=False)  # the run logs its whole config once, in train.py
        self.datasets: dict[str, Dataset] = {}
        self.class_names: list[str] = []

    @property
    def num_classes(self) -> int:
        if not self.class_names:
            raise RuntimeError("num_classes is known after datamodule.setup()")
        return len(self.class_names)

    def prepare_data(self) -> None:
        h = self.hparams
        if h.download and h.source in TORCHVISION:  # rank 0 only; setup() then finds the files
            load_image_splits(h.source, h.root, True, h.val_fraction, h.test_fraction, h.seed)

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        h = self.hparams
        splits, self.class_names = load_image_splits(
            h.source, h.root, False, h.val_fraction, h.test_fraction, h.seed
        )
        if not len(splits["train"]):
            log.info(
                "data.test_fraction=1: the test split is every image of %s (%d), none held out for training",
                h.root or h.source,
                len(splits["test"]),
            )
        for name, dataset in splits.items():
            transform = build_transform(
                name == "train", h.img_size, h.in_chans, h.mean, h.std, **(h.transform or {})
            )
            self.datasets[name] = Transformed(dataset, transform)
        if h.mixup and h.batch_size % 2:
            raise ValueError(
                f"Mixup pairs each image with another: data.batch_size={h.batch_size} must be even"
            )

    def train_dataloader(self) -> DataLoader:
        h = self.hparams
        collate = MixupCollate(timm.data.Mixup(**h.mixup, num_classes=self.num_classes)) if h.mixup else None
        # timm Mixup needs full, even batches, so a ragged last batch is dropped when mixing
        return make_loader(
            SkipUnreadable(self._split("train")),
            h.batch_size,
            True,
            h.num_workers,
            collate,
            drop_last=bool(h.mixup),
            trainer=self.trainer,
        )

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader("test")

    def _eval_loader(self, split: str) -> DataLoader:
        h = self.hparams
        return make_loader(
            SkipUnreadable(self._split(split)), h.batch_size, False, h.num_workers, trainer=self.trainer
        )

    def _split(self, name: str) -> Dataset:
        if not len(self.datasets[name]):
            raise ValueError(
                f"The {name} split is empty: data.test_fraction={self.hparams.test_fraction} puts every image in "
                "the test split, for a run that trains nothing (train=false); lower it to train"
            )
        return self.datasets[name]
