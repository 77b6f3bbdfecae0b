"""A run resumed or evaluated with ``ckpt_path=`` tokenizes as its checkpoint was trained (issue 19, item 3):
the data takes the checkpoint's tokenizer rather than one trained afresh on data that changed since, and a
different ``data.tokenizer_path`` is refused naming the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from lit_transformers.data.translation import TranslationDataModule
from lit_transformers.text import Tokenizer
from lit_transformers.train import train
from lit_transformers.utils.checkpoints import use_checkpoint_tokenizers

from conftest import TINY_LM, TINY_TRAINER, assert_user_error
from test_bert_classify import write_locale
from test_bert_train import TINY_MODEL

# the same documents and splits, but a tokenizer trained here on fewer characters than the checkpoint's
CHANGED_DATA = "data.tokenizer_train_chars=20000"


def _run_cfg(compose_cfg, run_dir: Path, *overrides: str):
    cfg = compose_cfg(*TINY_LM, "sample=null", *overrides)
    cfg.paths.output_dir = cfg.trainer.default_root_dir = cfg.logger.csv.save_dir = str(run_dir)
    cfg.callbacks.model_checkpoint.dirpath = str(run_dir / "checkpoints")
    return cfg


def _saved_tokenizer(checkpoint: Path, key: str = "tokenizer") -> Tokenizer:
    return Tokenizer.from_state(torch.load(checkpoint, weights_only=True)["hyper_parameters"][key])


def test_the_changed_data_would_train_another_tokenizer(compose_cfg, tmp_path, tiny_lm_run):
    """What makes the tests below able to fail: a fresh tokenizer on CHANGED_DATA is not the checkpoint's."""
    cfg = _run_cfg(compose_cfg, tmp_path, CHANGED_DATA)
    fresh = instantiate(cfg.data, _convert_="all").load_tokenizer()
    last = _saved_tokenizer(tiny_lm_run / "checkpoints" / "last.ckpt")
    assert fresh != last and fresh.vocab_size == last.vocab_size  # same shapes: only the metrics would tell


def test_evaluating_a_checkpoint_uses_its_tokenizer(compose_cfg, tmp_path, tiny_lm_run):
    last = tiny_lm_run / "checkpoints" / "last.ckpt"
    evaluate = ("train=false", "test=true", f"ckpt_path={last}", CHANGED_DATA)
    # the reference: the checkpoint's tokenizer named explicitly, as the README says for init_from
    explicit = train(_run_cfg(compose_cfg, tmp_path / "explicit", *evaluate, f"data.tokenizer_path={last}"))
    implicit = train(_run_cfg(compose_cfg, tmp_path / "implicit", *evaluate))
    assert implicit.metrics["test/loss"] == explicit.metrics["test/loss"]


def test_resuming_with_changed_data_keeps_the_checkpoint_tokenizer(compose_cfg, tmp_path, tiny_lm_run):
    last = tiny_lm_run / "checkpoints" / "last.ckpt"
    cfg = _run_cfg(
        compose_cfg, tmp_path, "test=false", "trainer.max_steps=6", f"ckpt_path={last}", CHANGED_DATA
    )
    train(cfg)
    resumed = tmp_path / "checkpoints" / "last.ckpt"
    assert torch.load(resumed, weights_only=True)["global_step"] == 6
    assert _saved_tokenizer(resumed) == _saved_tokenizer(last)


def test_bert_classify_resumed_on_more_messages_keeps_its_tokenizer(compose_cfg, tmp_path):
    """The issue's case: a classifier resumed on a catalog with more messages went on with a retrained WordPiece."""

    def classify(run_dir: Path, n_messages: int, *overrides: str):
        locale = write_locale(tmp_path / f"locale{n_messages}", n_messages=n_messages)
        cfg = compose_cfg(
            "experiment=bert_classify", f"data.path={locale}", "data.languages=[de,fr,es]", "data.vocab_size=300",
            "test=false", *TINY_MODEL, *TINY_TRAINER, *overrides,
        )  # fmt: skip
        cfg.paths.output_dir = cfg.trainer.default_root_dir = cfg.logger.csv.save_dir = str(run_dir)
        cfg.callbacks.model_checkpoint.dirpath = str(run_dir / "checkpoints")
        train(cfg)
        return run_dir / "checkpoints" / "last.ckpt"

    first = classify(tmp_path / "first", 10)
    resumed = classify(tmp_path / "resumed", 15, "trainer.max_steps=6", f"ckpt_path={first}")
    assert _saved_tokenizer(resumed) == _saved_tokenizer(first)


def test_a_different_tokenizer_path_is_refused_naming_the_checkpoint(compose_cfg, tmp_path, tiny_lm_run):
    last = tiny_lm_run / "checkpoints" / "last.ckpt"
    other = tmp_path / "other.json"
    Tokenizer.train(["an unrelated corpus of a few words"] * 20, "bpe", 300).save(other)
    cfg = _run_cfg(compose_cfg, tmp_path, "train=false", f"ckpt_path={last}", f"data.tokenizer_path={other}")
    assert_user_error(lambda: train(cfg), f"data.tokenizer_path={other}", f"data.tokenizer_path={last}")


def _two_sided_checkpoint(tmp_path: Path) -> tuple[Path, Tokenizer, Tokenizer]:
    """A translation checkpoint of data.joint_vocab=false: a target and a source tokenizer of its own."""
    target = Tokenizer.train(["das ist ein Haus", "die Katze schläft"] * 10, "bpe", 280)
    source = Tokenizer.train(["this is a house", "the cat sleeps"] * 10, "bpe", 270)
    path = tmp_path / "two_sided.ckpt"
    hyper_parameters = {"tokenizer": target.state(), "source_tokenizer": source.state()}
    torch.save({"state_dict": {}, "hyper_parameters": hyper_parameters}, path)
    return path, target, source


def test_translation_takes_both_tokenizers_of_its_checkpoint(tmp_path):
    path, target, source = _two_sided_checkpoint(tmp_path)
    checkpoint = torch.load(path, weights_only=True)
    data = OmegaConf.create({"joint_vocab": False, "tokenizer_path": None, "source_tokenizer_path": None})
    use_checkpoint_tokenizers(data, checkpoint, path)
    assert data.tokenizer_path == data.source_tokenizer_path == str(path)
    module = TranslationDataModule(source="file", path="unread.tsv", **data)
    assert module.load_tokenizers() == (source, target)
    # a source tokenizer of the checkpoint's target side is refused, and so is a joint vocabulary
    data.source_tokenizer_path = str(tmp_path / "target.json")
    target.save(data.source_tokenizer_path)
    with pytest.raises(ValueError, match=f"set data.source_tokenizer_path={path}"):
        use_checkpoint_tokenizers(data, checkpoint, path)
    joint = OmegaConf.create({"joint_vocab": True, "tokenizer_path": None, "source_tokenizer_path": None})
    with pytest.raises(ValueError, match="set data.joint_vocab=false"):
        use_checkpoint_tokenizers(joint, checkpoint, path)


def test_a_trusted_checkpoint_gives_the_data_a_plain_copy_of_its_tokenizers(tmp_path):
    """A checkpoint that needs trust_checkpoint=true may hold pickled objects, which the data's weights-only
    reading of a tokenizer_path .ckpt refuses: the data reads a plain copy of the tokenizers instead."""
    path, target, source = _two_sided_checkpoint(tmp_path)
    data = OmegaConf.create({"joint_vocab": False, "tokenizer_path": None, "source_tokenizer_path": None})
    use_checkpoint_tokenizers(data, torch.load(path, weights_only=True), path, copy_to=tmp_path / "run")
    copy = tmp_path / "run" / "checkpoint_tokenizers.ckpt"
    assert data.tokenizer_path == data.source_tokenizer_path == str(copy)
    assert Tokenizer.from_file(copy) == target
    assert Tokenizer.from_file(copy, checkpoint_key="source_tokenizer") == source
