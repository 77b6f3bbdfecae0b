"""Reading image files: the one opener every file-based source uses, and skipping the files it cannot read."""

from __future__ import annotations

import functools
import logging
from pathlib import Path

from PIL import Image
from torch.utils.data import Dataset

log = logging.getLogger(__name__)

# modes with an alpha band; P, L and RGB images mark a transparent colour in info["transparency"] instead
TRANSPARENT_MODES = ("RGBA", "LA", "PA", "RGBa", "La")


class UnreadableImageError(ValueError):
    """An image file PIL cannot decode (not an image, truncated, corrupt); the message names the file.

    A ValueError (a problem with the user's data), so should one escape ``SkipUnreadable``, ``train.py``
    reports it in one paragraph.
    """

    def __init__(self, path: str | Path, reason: Exception):
        super().__init__(f"Image {path} cannot be read ({type(reason).__name__}: {reason})")
        self.path = path


@functools.cache
def _log_once(message: str) -> None:
    log.info(message)


def open_image(path: str | Path) -> Image.Image:
    """The file as an RGB image, decoded now, so a broken file fails here with its name.

    Transparent pixels are composited onto white, as browsers show them: ``convert("RGB")`` alone keeps the
    colour stored under them, usually black, so black shapes on a transparent background would become
    all-black images and a classifier would silently learn the majority class.
    """
    try:
        with Image.open(path) as image:
            image.load()
            if image.mode not in TRANSPARENT_MODES and "transparency" not in image.info:
                return image.convert("RGB")
            _log_once("Images with transparency are composited onto a white background")
            white = Image.new("RGBA", image.size, (255, 255, 255, 255))
            return Image.alpha_composite(white, image.convert("RGBA")).convert("RGB")
    except (OSError, SyntaxError, Image.DecompressionBombError) as err:  # what PIL raises for a bad file
        raise UnreadableImageError(path, err) from err


class SkipUnreadable(Dataset):
    """Replaces an item whose image cannot be read by the next readable item, warning once per file.

    Skipping at load time rather than checking every file before training: a check costs a pass over the
    data (minutes for an ImageNet-sized folder, on every launch) and still misses truncated files, which
    fail only when decoded; large and web-scraped sets hold a few broken files that users want to train past.
    Replacing instead of dropping keeps batches full (Mixup and CLIP's cross-rank gather need that); an
    evaluation counts the replacement twice, so the warning asks for the file to be fixed. Counts are per
    process: each DataLoader worker keeps its own.
    """

    def __init__(self, dataset: Dataset):
        self.dataset = dataset
        self.unreadable: set[int] = set()  # known-bad indices: passed over without reopening or re-warning
        self.example: UnreadableImageError | None = None  # the last one, for the error when none is readable

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int):
        n = len(self)
        for j in ((i + k) % n for k in range(n)):
            if j in self.unreadable:
                continue
            try:
                return self.dataset[j]
            except UnreadableImageError as err:
                self.unreadable.add(j)
                self.example = err
                log.warning(
                    "Skipping an unreadable image (%d so far): %s; delete or replace the file",
                    len(self.unreadable),
                    err,
                )
        raise ValueError(
            f"None of the {n} images of this split can be read, e.g. {self.example}; "
            "point data.root (or data.path for captions) at image files"
        )
