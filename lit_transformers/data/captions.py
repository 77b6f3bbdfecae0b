"""Image-caption pairs for CLIP: digits with templated captions, or a CSV/JSONL of ``image, caption`` rows.

Rows that share an image path are one image with several captions: training draws one at random, and
retrieval counts any of them as a hit. Captions are tokenized by a BPE tokenizer trained on the train split
(cached like the LM's), or by ``tokenizer_path`` (a tokenizer.json or a parent checkpoint).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path

import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from lit_transformers.data.base import TextDataModule
from lit_transformers.data.image_io import SkipUnreadable, open_image
from lit_transformers.data.images import Transformed, build_transform, load_image_splits
from lit_transformers.data.loaders import make_loader
from lit_transformers.data.records import file_identity, read_records
from lit_transformers.text import Tokenizer, eos_terminated, split_by_fractions


def read_caption_table(
    path: str | Path,
    image_key: str = "image",
    caption_key: str = "caption",
    image_root: str | Path | None = None,
    encoding: str = "utf-8",
) -> dict[Path, list[str]]:
    """{image path: its captions} from a .csv (header row) or .jsonl file in ``encoding``
    (:func:`lit_transformers.data.records.read_records`); relative paths are taken from ``image_root``
    (default: the file's folder)."""
    required = {
        image_key: "rename it or set data.image_key",
        caption_key: "rename it or set data.caption_key",
    }
    setting = "data.path=<.csv or .jsonl of image, caption>"
    rows = read_records(path, (".csv", ".jsonl"), setting, required, encoding=encoding)
    if not rows:
        raise ValueError(
            f"Caption file {path} has no rows; it needs '{image_key}' and '{caption_key}' columns"
        )
    path = Path(path).expanduser()
    root = Path(image_root).expanduser() if image_root else path.parent
    table: dict[Path, list[str]] = {}
    for row in rows:
        table.setdefault(root / row.text(image_key), []).append(row.text(caption_key, numbers=True))
    absent = [str(p) for p in table if not p.is_file()]
    if absent:
        raise FileNotFoundError(
            f"{len(absent)} image(s) listed in {path} do not exist, e.g. {absent[0]}; "
            "set data.image_root to the folder they are relative to"
        )
    return table


class ImageFiles(Dataset):
    """Unlabelled images (label -1) read from paths, like the (PIL image, label) sources in ``images``."""

    def __init__(self, paths: Sequence[Path]):
        self.paths = list(paths)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[Image.Image, int]:
        return open_image(self.paths[i]), -1


class CaptionDataset(Dataset):
    """One item per image with one of its captions: random when training, fixed (cycling) when evaluating."""

    def __init__(
        self,
        images: Dataset,
        captions: list[list[str]],
        tokenizer: Tokenizer,
        context_length: int,
        train: bool,
    ):
        self.images, self.captions, self.train = images, captions, train
        self.tokenizer, self.context_length = tokenizer, context_length

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> dict:
        image, label = self.images[i]
        options = self.captions[i]
        caption = random.choice(options) if self.train else options[i % len(options)]
        tok = self.tokenizer
        ids = eos_terminated([tok.encode(caption)], tok.eos_id, tok.pad_id, self.context_length)[0]
        return {"image": image, "input_ids": ids, "image_index": i, "label": label}


# the digits' captions (the defaults of conf/data/digit_captions.yaml): training ones, also the validation
# zero-shot prompts, and test ones worded in ways training never saw
TRAIN_TEMPLATES = (
    "a photo of the number {}",
    "a handwritten {}",
    "a drawing of the digit {}",
    "the digit {}",
    "{} written by hand",
    "a low resolution image of a {}",
    "a black and white picture of {}",
    "an 8x8 scan of the number {}",
)
TEST_TEMPLATES = (
    "a scanned image of the numeral {}",
    "this is a handwritten {}",
    "an image showing the digit {}",
    "a sketch of the number {}",
)


class CaptionDataModule(TextDataModule):
    tokenizer_independent = TextDataModule.tokenizer_independent | {
        "test_templates",  # test captions are never trained on
        "context_length",
        "img_size",
        "in_chans",
        "mean",
        "std",
        "transform",
    }

    def __init__(
        self,
        source: str = "digits",
        path: str | None = None,
        image_root: str | None = None,
        image_key: str = "image",
        caption_key: str = "caption",
        encoding: str = "utf-8",
        train_templates: Sequence[str] = TRAIN_TEMPLATES,
        test_templates: Sequence[str] = TEST_TEMPLATES,
        vocab_size: int = 512,
        context_length: int = 16,
        img_size: int = 8,
        in_chans: int = 1,
        mean: Sequence[float] = (0.3,),
        std: Sequence[float] = (0.38,),
        transform: dict | None = None,
        batch_size: int = 64,
        val_fraction: float = 0.1,
        test_fraction: float = 0.2,
        **shared,
    ):
        super().__init__(val_fraction=val_fraction, test_fraction=test_fraction, **shared)
        self.class_names: list[str] = []  # digits only: zero-shot classification needs labels
        self.templates: dict[str, list[str]] = {}  # split -> zero-shot prompt templates

    def _digits(self) -> tuple[dict[str, Dataset], dict[str, list[list[str]]]]:
        h = self.hparams
        if not h.train_templates or not h.test_templates:
            raise ValueError(
                "Digit captions need data.train_templates and data.test_templates (strings with '{}')"
            )
        splits, self.class_names = load_image_splits(
            "digits", None, False, h.val_fraction, h.test_fraction, h.seed
        )
        # val reuses the training templates; test prompts are worded in ways training never saw
        self.templates = {"val": list(h.train_templates), "test": list(h.test_templates)}
        self.templates["train"] = self.templates["val"]
        captions = {
            name: [[t.format(self.class_names[label]) for t in self.templates[name]] for _, label in split]
            for name, split in splits.items()
        }
        return splits, captions

    def _table(self) -> tuple[dict[str, Dataset], dict[str, list[list[str]]]]:
        h = self.hparams
        if h.path is None:
            raise ValueError("data.path is required for source=table; set data.path=<.csv or .jsonl>")
        table = read_caption_table(h.path, h.image_key, h.caption_key, h.image_root, h.encoding)
        paths = list(table)
        parts = split_by_fractions([str(p) for p in paths], h.val_fraction, h.test_fraction, h.seed, "images")
        splits = {name: ImageFiles([paths[i] for i in idx]) for name, idx in parts.items()}
        return splits, {name: [table[paths[i]] for i in idx] for name, idx in parts.items()}

    @cached_property
    def _splits(self) -> tuple[dict[str, Dataset], dict[str, list[list[str]]]]:
        """Untransformed images and their captions per split, computed once per process."""
        h = self.hparams
        if h.source not in ("digits", "table"):
            raise ValueError(f"Unknown caption source {h.source!r}; choose digits or table (CSV/JSONL)")
        return self._digits() if h.source == "digits" else self._table()

    def data_identity(self) -> list | None:
        return file_identity([self.hparams.path]) if self.hparams.source == "table" else None

    def tokenizer_texts(self) -> list[str]:
        """The training split's distinct captions."""
        return list(dict.fromkeys(c for caps in self._splits[1]["train"] for c in caps))

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        h = self.hparams
        splits, self.captions = self._splits
        self.tokenizer = self.load_tokenizer()
        for name, split in splits.items():
            transform = build_transform(
                name == "train", h.img_size, h.in_chans, h.mean, h.std, **(h.transform or {})
            )
            self.datasets[name] = CaptionDataset(
                Transformed(split, transform),
                self.captions[name],
                self.tokenizer,
                h.context_length,
                name == "train",
            )

    def retrieval_targets(self, split: str) -> tuple[list[str], torch.Tensor]:
        """The split's distinct caption texts and a (n_texts, n_images) bool matrix: text j describes image i.
        Identical texts are merged, so every image a text describes counts as a hit for it."""
        texts = list(dict.fromkeys(c for caps in self.captions[split] for c in caps))
        column = {t: j for j, t in enumerate(texts)}
        relevant = torch.zeros(len(texts), len(self.captions[split]), dtype=torch.bool)
        for i, caps in enumerate(self.captions[split]):
            relevant[[column[c] for c in caps], i] = True
        return texts, relevant

    def train_dataloader(self) -> DataLoader:
        h = self.hparams
        # a ragged last batch would give a step with fewer negatives (and uneven all_gather shapes under DDP)
        return make_loader(
            SkipUnreadable(self.datasets["train"]),
            h.batch_size,
            True,
            h.num_workers,
            drop_last=True,
            trainer=self.trainer,
        )

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader("test")

    def _eval_loader(self, split: str) -> DataLoader:
        h = self.hparams
        # the eval step all-gathers features at every batch, so every rank must run as many batches: Lightning
        # pads the shares with repeated images, which ContrastiveTask._evaluate drops by image index
        return make_loader(
            SkipUnreadable(self.datasets[split]),
            h.batch_size,
            False,
            h.num_workers,
            trainer=self.trainer,
            shard_eval=False,
        )
