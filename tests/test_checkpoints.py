"""Checkpoints load without unpickling code; bad or foreign checkpoints are refused with a message that
names the file, what is wrong and the fix (through the real command line once, the others in-process)."""

from __future__ import annotations

import fractions
import pickle
from pathlib import Path

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from lit_transformers.generate import continuations
from lit_transformers.text import Tokenizer
from lit_transformers.train import train
from lit_transformers.utils.checkpoints import read_checkpoint

from conftest import TINY_LM, assert_short_error, assert_user_error, compose_train_cfg, train_main

VIT_FAST = [
    "trainer.max_steps=2",
    "trainer.val_check_interval=2",
    "trainer.limit_val_batches=1",
    "sample=null",
]


@pytest.fixture(scope="module")
def checkpoints(tiny_lm_run, tmp_path_factory, cache_dir) -> dict[str, Path]:
    """A tiny GPT and a tiny ViT checkpoint, each in its own run folder as train.py leaves it."""
    vit = tmp_path_factory.mktemp("vit")
    cfg = compose_train_cfg(
        "experiment=vit",
        "test=false",
        *VIT_FAST,
        "callbacks.progress_bar=null",
        output_dir=vit,
        cache_dir=cache_dir,
    )
    OmegaConf.save(cfg, vit / "config_resolved.yaml")  # as resolve_once leaves it in the run
    train(cfg)
    return {"gpt": tiny_lm_run / "checkpoints" / "last.ckpt", "vit": vit / "checkpoints" / "last.ckpt"}


def test_our_checkpoints_load_with_weights_only(checkpoints):
    for path in checkpoints.values():
        checkpoint = torch.load(path, weights_only=True)  # no arbitrary unpickling needed
        assert checkpoint["task_class"].startswith("lit_transformers.tasks.")


def test_a_checkpoint_with_pickled_objects_is_refused_unless_trusted(checkpoints, compose_cfg, tmp_path):
    checkpoint = torch.load(checkpoints["gpt"], weights_only=True)
    checkpoint["note"] = fractions.Fraction(1, 3)  # any class outside torch's weights-only allowlist
    path = tmp_path / "pickled.ckpt"
    torch.save(checkpoint, path)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=True)  # the independent check: torch itself refuses it
    with pytest.raises(ValueError, match="trust_checkpoint=true"):
        read_checkpoint(path)
    assert read_checkpoint(path, trusted=True)["note"] == fractions.Fraction(1, 3)
    test_only = [*TINY_LM, "train=false", "sample=null", f"ckpt_path={path}"]
    assert_user_error(lambda: train(compose_cfg(*test_only)), str(path), "trust_checkpoint=true")
    assert "test/loss" in train(compose_cfg(*test_only, "trust_checkpoint=true")).metrics


def test_a_pickled_tokenizer_path_is_read_only_when_trusted(checkpoints, compose_cfg, tmp_path):
    checkpoint = torch.load(checkpoints["gpt"], weights_only=True)
    checkpoint["note"] = fractions.Fraction(1, 3)
    # not the tokenizer that the run would train on its own corpus
    tokenizer = Tokenizer.train(["a tokenizer of its own, from another text"] * 4, "bpe", vocab_size=280)
    checkpoint["hyper_parameters"]["tokenizer"] = tokenizer.state()
    path = tmp_path / "pickled.ckpt"
    torch.save(checkpoint, path)
    run = [*TINY_LM, "trainer.max_steps=2", "test=false", "sample=null", f"data.tokenizer_path={path}"]
    untrusted = [f"data.tokenizer_path={path}", "trust_checkpoint=true"]  # what the refusal names
    assert_user_error(lambda: train(compose_cfg(*run)), *untrusted)
    train(compose_cfg(*run, "trust_checkpoint=true"))
    trained_with = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)["hyper_parameters"]
    assert Tokenizer.from_state(trained_with["tokenizer"]) == tokenizer


def test_a_truncated_checkpoint_is_named_as_corrupt(checkpoints, tmp_path):
    data = checkpoints["gpt"].read_bytes()
    path = tmp_path / "truncated.ckpt"
    path.write_bytes(data[: len(data) // 2])
    result = train_main(*TINY_LM, f"ckpt_path={path}", f"hydra.run.dir={tmp_path / 'run'}")
    assert_short_error(result, str(path), "truncated or corrupt")


def test_a_checkpoint_of_another_experiment_is_named(checkpoints, compose_cfg):
    cfg = compose_cfg(*TINY_LM, f"ckpt_path={checkpoints['vit']}")
    assert_user_error(lambda: train(cfg), "ImageClassificationTask", "'vit'", "CausalLMTask")


def test_resuming_with_another_model_config_names_the_difference(checkpoints, compose_cfg):
    overrides = [o for o in TINY_LM if not o.startswith("model.n_layer")]
    cfg = compose_cfg(*overrides, "model.n_layer=2", f"ckpt_path={checkpoints['gpt']}")
    assert_user_error(lambda: train(cfg), "model.n_layer: checkpoint 1, this run 2", "init_from=")


def test_generate_on_a_vision_checkpoint_says_so(checkpoints):
    GlobalHydra.instance().clear()
    with initialize_config_module("lit_transformers.conf", version_base="1.3"):
        cfg = compose("generate", overrides=[f"ckpt={checkpoints['vit']}"])
    assert_user_error(lambda: continuations(cfg), "ImageClassificationTask", "CausalLMTask")


def test_last_ckpt_holds_the_final_step_when_later_validations_do_not_improve(compose_cfg, tmp_path):
    # lr 0: every validation's val/loss equals the first, so no later one writes a top-k checkpoint
    cfg = compose_cfg(*TINY_LM, "trainer.max_steps=6", "task.optimizer.lr=0", "test=false", "sample=null")
    train(cfg)
    folder = tmp_path / "checkpoints"
    assert [p.name for p in folder.glob("step_*.ckpt")] == ["step_000002.ckpt"]  # the first validation's
    assert torch.load(folder / "last.ckpt", weights_only=True)["global_step"] == 6


class CrashAtStep(L.Callback):
    """Raises after training step ``step``: a crash after the last save."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            raise RuntimeError("boom")


def test_a_crash_names_the_step_last_ckpt_holds(compose_cfg, tmp_path, caplog):
    cfg = compose_cfg(
        *TINY_LM, "trainer.max_steps=6", "test=false", "sample=null",
        "+callbacks.crash._target_=test_checkpoints.CrashAtStep", "+callbacks.crash.step=3",
    )  # fmt: skip
    with pytest.raises(RuntimeError, match="boom"):
        train(cfg)
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 2  # the validation at step 2
    assert f"RuntimeError at step 3; {last} holds step 2: resume from it with ckpt_path={last}" in caplog.text
