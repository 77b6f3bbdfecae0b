"""Bad data input ends in a message naming the file and the option that fixes it, never in a traceback:
corrupt and transparent images, binary and mis-encoded corpora, an unreachable Hub dataset, batch_size=0."""

from __future__ import annotations

import errno
import fractions
import json
import logging
import os
import re
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
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
from lit_transformers.utils.errors import report_user_errors

from conftest import TINY_LM, TINY_TRAINER, assert_user_error, train_main
from image_helpers import write_image_folder
from test_bert_classify import write_locale
from test_instructgpt import TINY as TINY_INSTRUCT
from test_instructgpt import TINY_DATA

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


# ---- files that cannot be loaded, and a disk that fills up: one paragraph each, exit 1 ----------------------


def _cut_in_half(source: Path, to: Path) -> Path:
    """A copy of ``source`` cut short, as an interrupted download or copy leaves it."""
    data = source.read_bytes()
    to.write_bytes(data[: len(data) // 2])
    return to


def _pickled(checkpoint: Path, to: Path) -> Path:
    """``checkpoint`` with an object outside torch's weights-only allowlist: loading it unpickles code."""
    saved = torch.load(checkpoint, weights_only=True)
    saved["note"] = fractions.Fraction(1, 3)
    torch.save(saved, to)
    return to


def _saved(state: dict, to: Path) -> Path:
    torch.save(state, to)
    return to


def _hf_bert_folder(folder: Path, weights: str) -> Path:
    """A Hugging Face BERT folder whose config is right and whose weights file ``weights`` is broken."""
    folder.mkdir()
    config = {"model_type": "bert", "vocab_size": 300, "hidden_size": 32, "num_hidden_layers": 1}
    config |= {"num_attention_heads": 2, "intermediate_size": 64, "max_position_embeddings": 48}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / weights).write_bytes(b"\x00 not what save_pretrained writes " * 4)
    return folder


def _classify(tmp_path: Path, *overrides: str) -> list[str]:
    locale = write_locale(tmp_path / "locale", n_messages=10)
    return [
        "experiment=bert_classify",
        f"data.path={locale}",
        "data.languages=[de,fr,es]",
        *TINY_TRAINER,
        *overrides,
    ]


def _disk_full_on_save(monkeypatch) -> None:
    """torch.save writes a first part of the checkpoint, then the disk is full."""

    def save(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 first bytes of the checkpoint")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(torch, "save", save)


@dataclass(frozen=True)
class Refused:
    """A run that must end in one paragraph naming ``needles``, exit 1: ``overrides`` given a folder and the tiny
    GPT checkpoint; ``setup`` given pytest's monkeypatch; with ``launcher_env``, through train.py's main (in this
    process, those variables set), where Hydra itself meets the problem."""

    overrides: Callable[[Path, Path], list[str]]
    needles: tuple[str, ...]
    setup: Callable | None = None
    launcher_env: dict[str, str] | None = None


# a second torchrun node, started with --master_addr but no --rdzv-id
TORCHRUN_WITHOUT_JOB_ID = {"TORCHELASTIC_RUN_ID": "none", "RANK": "1", "GROUP_RANK": "1", "LOCAL_RANK": "0"}
TORCHRUN_WITHOUT_JOB_ID |= {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}

REFUSED = {
    "tokenizer_path=<truncated ckpt>": Refused(
        lambda tmp, ckpt: [*TINY_LM, f"data.tokenizer_path={_cut_in_half(ckpt, tmp / 'cut.ckpt')}"],
        ("data.tokenizer_path=", "truncated or corrupt"),
    ),
    "tokenizer_path=<pickled ckpt>": Refused(
        lambda tmp, ckpt: [*TINY_LM, f"data.tokenizer_path={_pickled(ckpt, tmp / 'pickled.ckpt')}"],
        (
            "data.tokenizer_path=",
            "fractions.Fraction",
            "If you trust where it came from, set trust_checkpoint=true",
        ),
    ),
    "init_from_hf=<bad pytorch_model.bin>": Refused(
        lambda tmp, _: _classify(
            tmp, f"task.init_from_hf={_hf_bert_folder(tmp / 'hf', 'pytorch_model.bin')}"
        ),
        ("pytorch_model.bin (task.init_from_hf=", "truncated or corrupt", "Download the checkpoint again"),
    ),
    "init_from_hf=<bad model.safetensors>": Refused(
        lambda tmp, _: _classify(
            tmp, f"task.init_from_hf={_hf_bert_folder(tmp / 'hf', 'model.safetensors')}"
        ),
        ("model.safetensors (task.init_from_hf=", "truncated or corrupt (SafetensorError"),
    ),
    "timm pretrained_file=<truncated>": Refused(
        lambda tmp, ckpt: [
            "experiment=vit",
            *TINY_TRAINER,
            "model.backbone.pretrained=true",
            f"model.backbone.pretrained_file={_cut_in_half(ckpt, tmp / 'vit.pth')}",
        ],
        ("model.backbone.pretrained_file=", "truncated or corrupt"),
    ),
    "timm pretrained_file=<weights of another size>": Refused(
        lambda tmp, _: [
            "experiment=vit",
            *TINY_TRAINER,
            "model.backbone.pretrained=true",
            f"model.backbone.pretrained_file={_saved({'cls_token': torch.zeros(1, 1, 7)}, tmp / 'other.pth')}",
        ],
        ("model.backbone.pretrained_file=", "does not fit timm model", "size mismatch for cls_token"),
    ),
    "disk full while saving a checkpoint": Refused(
        lambda tmp, _: [*TINY_LM, "trainer.max_steps=2"],
        ("No space left", "nothing partial was left", "hydra.run.dir=<folder>"),
        setup=_disk_full_on_save,
    ),
    "torchrun on two nodes without --rdzv-id": Refused(
        lambda tmp, _: [*TINY_LM, f"paths.log_dir={tmp}"],
        ("several nodes without a job id", "--rdzv-id=<job id>"),
        launcher_env=TORCHRUN_WITHOUT_JOB_ID,
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_unloadable_files_a_full_disk_and_torchrun_without_a_job_id_end_in_one_paragraph(
    case, compose_cfg, tmp_path, tiny_lm_run, monkeypatch, capsys
):
    refused = REFUSED[case]
    overrides = [
        *refused.overrides(tmp_path, tiny_lm_run / "checkpoints" / "last.ckpt"),
        "test=false",
        "sample=null",
    ]
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    if refused.launcher_env:
        result = train_main(*overrides, env=refused.launcher_env)
        code, stderr = result.returncode, result.stderr
    else:
        cfg = compose_cfg(*overrides)
        if refused.setup:
            refused.setup(monkeypatch)
        # report_user_errors: what the command line does with the error
        with pytest.raises(SystemExit) as exit_code, report_user_errors():
            train(cfg)
        code, stderr = exit_code.value.code, capsys.readouterr().err
    assert code == 1 and "Traceback" not in stderr, stderr
    message = stderr[stderr.index("Error (") :].strip().splitlines()
    assert len(message) == 2 and "HYDRA_FULL_ERROR=1" in message[1], message  # one paragraph, then the hint
    for needle in refused.needles:
        assert needle in message[0], (needle, message[0])
    assert "weights_only=False" not in message[0]  # torch's advice, which would run the file's code
    assert not list(tmp_path.glob("**/*.partial")) and not list(tmp_path.glob("checkpoints/*.ckpt"))


@pytest.mark.parametrize(
    "overrides,key,context",
    [
        (
            ["experiment=bert_classify", "model=bert_tiny", "data.max_seq_len=200"],
            "data.max_seq_len",
            "max_position",
        ),
        (
            ["experiment=gpt_sft", *TINY_INSTRUCT, *TINY_DATA, "data.max_length=64"],
            "data.max_length",
            "block_size",
        ),
        ([*TINY_LM, "data.block_size=48"], "data.block_size", "block_size"),
    ],
)
def test_data_longer_than_the_models_context_is_refused_before_training(overrides, key, context, compose_cfg):
    """A sequence bound above the model's context would crash at the first batch that reaches it, after steps
    and with no checkpoint; the run refuses it up front, naming both keys."""
    cfg = compose_cfg(*overrides, "trainer.max_steps=2")
    assert_user_error(lambda: train(cfg), f"{key}=", f"model.{context}=", f"raise model.{context}")
