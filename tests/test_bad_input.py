"""Bad data input ends in a message naming the file and the option that fixes it, never in a traceback:
corrupt and transparent images, binary and mis-encoded corpora, an unreachable Hub dataset, batch_size=0."""

from __future__ import annotations

import logging
import re
import sys
import types

import numpy as np
import pytest
from PIL import Image

from lit_transformers.data import (
    CaptionDataModule,
    CorpusSpec,
    ImageClassificationDataModule,
    load_documents,
    load_image_splits,
)
from lit_transformers.data.captions import ImageFiles
from lit_transformers.data.corpus import fingerprint
from lit_transformers.data.image_io import SkipUnreadable, _log_once
from lit_transformers.train import train

from conftest import TINY_LM, assert_user_error
from image_helpers import write_image_folder

FRENCH = "Le café est très bon.\n\nÀ la maison, nous mangeons des crêpes.\n\nThe next paragraph is English.\n"


def test_corrupt_image_in_a_folder_is_skipped_with_a_warning_naming_it(tmp_path, compose_cfg, caplog):
    root = write_image_folder(tmp_path / "images", classes=("cat", "dog"), per_class=6, size=8)
    bad = root / "cat" / "3.png"
    bad.write_bytes(b"<html>404 Not Found</html>")  # what a failed download leaves behind
    cfg = compose_cfg(
        "experiment=vit",
        "data.source=folder",
        f"data.root={root}",
        "data.val_fraction=0.25",
        "data.test_fraction=0.25",
        "data.batch_size=4",
        "trainer.max_steps=4",  # two epochs of two batches: every split reads every file
        "trainer.val_check_interval=2",
        "callbacks.progress_bar=null",
        "callbacks.model_summary=null",
    )
    with caplog.at_level(logging.WARNING):
        train(cfg)  # raises nothing
    assert f"Skipping an unreadable image (1 so far): Image {bad} cannot be read" in caplog.text
    assert not any(record.exc_info for record in caplog.records)  # a warning, not a traceback
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()


def test_caption_images_share_the_opener_and_unreadable_ones_are_replaced_once_warned(tmp_path, caplog):
    folder = write_image_folder(tmp_path, classes=("all",), per_class=2, size=8) / "all"
    bad = folder / "empty.png"
    bad.write_bytes(b"")
    images = SkipUnreadable(ImageFiles([folder / "0.png", bad, folder / "1.png"]))
    with caplog.at_level(logging.WARNING):
        items = [images[i] for i in (0, 1, 2, 1)]
    expected = np.asarray(Image.open(folder / "1.png").convert("RGB"))
    assert all(np.array_equal(np.asarray(image), expected) for image, _ in items[1:])  # the next one instead
    assert [str(bad) in record.getMessage() for record in caplog.records] == [True]  # once per file
    with pytest.raises(ValueError, match=f"{re.escape(str(bad))}.*data.root"):
        SkipUnreadable(ImageFiles([bad]))[0]


@pytest.mark.parametrize("mode", ["RGBA", "LA", "P"])
def test_black_shape_on_transparent_background_loads_as_black_on_white(tmp_path, mode, caplog):
    """A transparent pixel stores a colour too, here black: dropping alpha would give all-black images."""
    inside = np.zeros((8, 8), bool)
    inside[2:6, 2:6] = True
    if mode == "P":  # palette 0: black, marked transparent; palette 1: black
        shape = Image.fromarray(inside.astype(np.uint8), "P")
        shape.putpalette([0, 0, 0, 0, 0, 0])
        save = {"transparency": 0}
    else:
        rgba = np.zeros((8, 8, 4), np.uint8)
        rgba[..., 3] = 255 * inside
        shape, save = Image.fromarray(rgba, "RGBA").convert(mode), {}
    for name in ("circle", "square"):
        (tmp_path / name).mkdir()
        for i in range(4):
            shape.save(tmp_path / name / f"{i}.png", **save)
    _log_once.cache_clear()
    with caplog.at_level(logging.INFO):
        splits, _ = load_image_splits("folder", str(tmp_path), val_fraction=0.25, test_fraction=0.25)
        images = [np.asarray(image.convert("L")) for image, _ in splits["train"]]
    assert all(np.array_equal(image, np.where(inside, 0, 255)) for image in images)
    assert sum("white background" in record.getMessage() for record in caplog.records) == 1  # not per image


def test_binary_corpus_file_is_refused_naming_it_and_the_fix(tmp_path, compose_cfg):
    path = tmp_path / "train.txt"
    path.write_bytes(np.arange(4096, dtype=np.uint16).tobytes())  # token ids, as in nanoGPT's train.bin
    cfg = compose_cfg("data.corpus.source=path", f"data.corpus.path={path}", *TINY_LM)
    assert_user_error(lambda: train(cfg), f"Corpus file {path} is not text", "data.corpus.path")


def test_latin1_corpus_is_refused_naming_the_encoding_which_then_loads_it_under_its_own_tokenizer(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_bytes(FRENCH.encode("latin-1"))
    utf8 = CorpusSpec(source="path", path=str(path))
    with pytest.raises(
        ValueError, match=f"{re.escape(str(path))} is not utf-8 text.*data.corpus.encoding=latin-1"
    ):
        load_documents(utf8)
    latin1 = CorpusSpec(source="path", path=str(path), encoding="latin-1")
    assert "".join(text for _, text in load_documents(latin1)).split() == FRENCH.split()
    assert fingerprint(latin1) != fingerprint(utf8)


def test_folder_corpus_names_its_binary_file_and_keeps_a_few_stray_bytes_with_a_warning(tmp_path, caplog):
    (tmp_path / "notes.txt").write_bytes("café crème, naïve, déjà vu ".encode() * 20 + b"\xff\n")
    with caplog.at_level(logging.WARNING):
        (text,) = [text for _, text in load_documents(CorpusSpec(source="path", path=str(tmp_path)))]
    assert text.count("\ufffd") == 1 and "notes.txt: 1 byte" in caplog.text
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "tokens.txt").write_bytes(np.arange(100, dtype=np.uint16).tobytes())
    with pytest.raises(ValueError, match="tokens.txt is not text"):
        load_documents(CorpusSpec(source="path", path=str(tmp_path)))


def test_unreachable_hub_dataset_is_one_line_naming_the_local_copy_options(compose_cfg, monkeypatch):
    def load_dataset(path, name=None, data_files=None, split=None):  # what datasets 2.18 to 5.x raise offline
        raise ConnectionError(f"Couldn't reach {path!r} on the Hub (LocalEntryNotFoundError)")

    # the test suite must not need the optional `datasets` package
    fake = types.SimpleNamespace(load_dataset=load_dataset, DatasetDict=type("DatasetDict", (dict,), {}))
    monkeypatch.setitem(sys.modules, "datasets", fake)
    cfg = compose_cfg("data.corpus.source=hub", "data.corpus.name=wikitext", *TINY_LM)
    assert_user_error(
        lambda: train(cfg),
        "Dataset 'wikitext' could not be reached",
        "data.corpus.name=<folder written by Dataset.save_to_disk>",
        "data.corpus.data_files=",
    )


def test_missing_hub_dataset_names_the_keys_to_check(monkeypatch):
    class DatasetNotFoundError(FileNotFoundError):  # as datasets.exceptions.DatasetNotFoundError
        pass

    def load_dataset(path, *args, **kwargs):
        raise DatasetNotFoundError(f"Dataset '{path}' doesn't exist on the Hub or cannot be accessed.")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    with pytest.raises(FileNotFoundError, match="'wikitxt' doesn't exist.*data.corpus.name.*data_files"):
        load_documents(CorpusSpec(source="hub", name="wikitxt"))


def test_batch_size_zero_names_data_batch_size(compose_cfg):
    overrides = [o for o in TINY_LM if not o.startswith("data.batch_size=")]
    cfg = compose_cfg(*overrides, "data.batch_size=0")
    assert_user_error(lambda: train(cfg), "data.batch_size=0", "set data.batch_size to 1 or more")


@pytest.mark.parametrize("datamodule", [ImageClassificationDataModule, CaptionDataModule])
def test_image_datamodules_reject_batch_size_zero_naming_the_key(datamodule):
    with pytest.raises(ValueError, match="data.batch_size=0"):
        datamodule(batch_size=0)
