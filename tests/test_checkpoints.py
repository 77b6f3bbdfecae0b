"""Checkpoints load without unpickling code; bad or foreign checkpoints are refused with a message that
names the file, what is wrong and the fix (real command lines, in subprocesses)."""

from __future__ import annotations

import fractions
import pickle
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from lit_transformers.train import train
from lit_transformers.utils.checkpoints import read_checkpoint

from conftest import TINY_LM, compose_train_cfg, run_cli, train_cli

VIT_FAST = [
    "trainer.max_steps=2",
    "trainer.val_check_interval=2",
    "trainer.limit_val_batches=1",
    "sample=null",
]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, cache_dir) -> dict[str, Path]:
    """A tiny GPT and a tiny ViT checkpoint, each in its own run folder as train.py leaves it."""
    root = tmp_path_factory.mktemp("ckpts")
    out = {}
    for name, overrides in {
        "gpt": [*TINY_LM, "test=false", "sample=null"],
        "vit": ["experiment=vit", "test=false", *VIT_FAST, "callbacks.progress_bar=null"],
    }.items():
        cfg = compose_train_cfg(*overrides, output_dir=root / name, cache_dir=cache_dir)
        (root / name).mkdir()
        OmegaConf.save(cfg, root / name / "config_resolved.yaml")  # as resolve_once leaves it in the run
        train(cfg)
        out[name] = root / name / "checkpoints" / "last.ckpt"
    return out


def _short_error(result, *needles: str) -> None:
    text = result.stderr + result.stdout
    assert result.returncode != 0, text[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    for needle in needles:
        assert needle in text, (needle, text[-2000:])
    assert len(result.stderr.strip().splitlines()) < 20, result.stderr


def test_our_checkpoints_load_with_weights_only(checkpoints):
    for path in checkpoints.values():
        checkpoint = torch.load(path, weights_only=True)  # no arbitrary unpickling needed
        assert checkpoint["task_class"].startswith("lit_transformers.tasks.")


def test_a_checkpoint_with_pickled_objects_is_refused_unless_trusted(checkpoints, tmp_path, cache_dir):
    checkpoint = torch.load(checkpoints["gpt"], weights_only=True)
    checkpoint["note"] = fractions.Fraction(1, 3)  # any class outside torch's weights-only allowlist
    path = tmp_path / "pickled.ckpt"
    torch.save(checkpoint, path)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=True)  # the independent check: torch itself refuses it
    with pytest.raises(ValueError, match="trust_checkpoint=true"):
        read_checkpoint(path)
    assert read_checkpoint(path, trusted=True)["note"] == fractions.Fraction(1, 3)
    refused = train_cli(
        *TINY_LM, "train=false", "sample=null", f"ckpt_path={path}", f"hydra.run.dir={tmp_path / 'r1'}"
    )
    _short_error(refused, str(path), "trust_checkpoint=true")
    trusted = train_cli(
        *TINY_LM,
        "train=false",
        "sample=null",
        f"ckpt_path={path}",
        "trust_checkpoint=true",
        f"hydra.run.dir={tmp_path / 'r2'}",
        f"paths.cache_dir={cache_dir}",
    )
    assert trusted.returncode == 0, trusted.stderr[-3000:]
    assert "test/loss" in trusted.stdout


def test_a_truncated_checkpoint_is_named_as_corrupt(checkpoints, tmp_path):
    data = checkpoints["gpt"].read_bytes()
    path = tmp_path / "truncated.ckpt"
    path.write_bytes(data[: len(data) // 2])
    result = train_cli(*TINY_LM, f"ckpt_path={path}", f"hydra.run.dir={tmp_path / 'run'}")
    _short_error(result, str(path), "truncated or corrupt")


def test_a_checkpoint_of_another_experiment_is_named(checkpoints, tmp_path):
    result = train_cli(*TINY_LM, f"ckpt_path={checkpoints['vit']}", f"hydra.run.dir={tmp_path / 'run'}")
    _short_error(result, "ImageClassificationTask", "'vit'", "CausalLMTask")


def test_resuming_with_another_model_config_names_the_difference(checkpoints, tmp_path):
    overrides = [o for o in TINY_LM if not o.startswith("model.n_layer")]
    result = train_cli(
        *overrides, "model.n_layer=2", f"ckpt_path={checkpoints['gpt']}", f"hydra.run.dir={tmp_path}"
    )
    _short_error(result, "model.n_layer: checkpoint 1, this run 2", "init_from=")


def test_generate_on_a_vision_checkpoint_says_so(checkpoints):
    result = run_cli(
        sys.executable, "-m", "lit_transformers.generate", f"ckpt={checkpoints['vit']}", timeout=120
    )
    _short_error(result, "ImageClassificationTask", "CausalLMTask")
