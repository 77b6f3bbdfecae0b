"""Every family trains in the GPU recipes' precisions with its default fused AdamW and gradient clipping, on CPU,
so that a break fails here rather than on a user's first GPU job. Clipping is checked on the gradients that each
optimizer step applied (a hook after the step: a step given a closure computes them inside), against a clip value
far below any tiny model's gradient norm."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from omegaconf import open_dict
from test_bert_token_classify import write_conll
from test_translation import _translation, write_parallel_locale
from torch.optim.optimizer import register_optimizer_step_post_hook

from lit_transformers.train import train

from conftest import TINY_LM, TINY_TRAINER
from test_bert_classify import write_locale
from test_bert_train import TINY_BERT, TINY_MODEL
from test_instructgpt import TINY, TINY_DATA, TINY_TASK

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

CLIP = 1e-3  # a random tiny model's gradient norm is orders of magnitude above this: every step clips
SHORT = ["trainer.max_steps=2", "test=false", "sample=null"]
PLAIN = [f"trainer.gradient_clip_val={CLIP}"]  # automatic optimisation
INSTRUCT = [*TINY, *TINY_DATA]  # and TINY_TASK where the stage generates

# each family's experiment at its tiny test size: overrides, given a folder for its data files
FAMILIES: dict[str, Callable[[Path], list[str]]] = {
    "gpt_pretrain": lambda _: ["experiment=gpt_pretrain", *TINY_LM, *PLAIN],
    "gpt_sft": lambda _: ["experiment=gpt_sft", *INSTRUCT, *TINY_TASK, *PLAIN],
    "gpt_reward": lambda _: ["experiment=gpt_reward", *INSTRUCT, *PLAIN],
    "gpt_ppo": lambda _: [
        "experiment=gpt_ppo",
        *INSTRUCT,
        *TINY_TASK,
        f"task.max_grad_norm={CLIP}",
    ],  # manual clip_gradients
    "gpt_dpo": lambda _: ["experiment=gpt_dpo", *INSTRUCT, *TINY_TASK, *PLAIN],
    "bert_pretrain": lambda _: ["experiment=bert_pretrain", *TINY_BERT, *PLAIN],
    "bert_classify": lambda tmp: [
        "experiment=bert_classify",
        f"data.path={write_locale(tmp / 'locale', n_messages=10)}",
        "data.vocab_size=300",
        "data.languages=[de,fr,es]",
        *TINY_MODEL,
        *TINY_TRAINER,
        *PLAIN,
    ],  # fmt: skip
    "bert_token_classify": lambda tmp: [
        "experiment=bert_token_classify",
        f"data.path={write_conll(tmp / 'train.conll')}",
        "data.vocab_size=100",
        *TINY_MODEL,
        *TINY_TRAINER,
        *PLAIN,
    ],  # fmt: skip
    "translation": lambda tmp: [*_translation(write_parallel_locale(tmp / "locale")), *PLAIN],
    "vit": lambda _: ["experiment=vit", *TINY_TRAINER, *PLAIN],
    "clip": lambda _: ["experiment=clip", *TINY_TRAINER, *PLAIN],
}


def step_grad_norms(cfg) -> tuple[dict[str, float], list[float]]:
    """Train ``cfg``; its final metrics and the global norm of the gradients each optimizer step applied."""
    norms: list[float] = []

    def record(optimizer, args, kwargs):
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        norms.append(torch.nn.utils.get_total_norm(grads).item())

    handle = register_optimizer_step_post_hook(record)
    try:
        metrics = train(cfg).metrics
    finally:
        handle.remove()
    return metrics, norms


def assert_trained_with_clipped_gradients(metrics: dict[str, float], norms: list[float]) -> None:
    assert norms, "no optimizer step ran"
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert any(key.startswith(("train/", "loss/")) for key in metrics), metrics
    for norm in norms:  # bf16 gradients round the norm to ~3 significant digits
        assert norm == pytest.approx(CLIP, rel=0.02), norms


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_trains_in_bf16_mixed_with_fused_adamw_and_clipping(compose_cfg, tmp_path, family):
    cfg = compose_cfg(*FAMILIES[family](tmp_path), *SHORT, "trainer.precision=bf16-mixed")
    assert cfg.task.optimizer.fused  # the default under test
    assert_trained_with_clipped_gradients(*step_grad_norms(cfg))


@pytest.mark.parametrize(
    "fused", [True, False]
)  # the fused step unscales itself; Lightning unscales the other
@pytest.mark.parametrize("family", ["gpt_pretrain", "gpt_ppo"])  # automatic and manual clipping
def test_16_mixed_with_a_grad_scaler_unscales_before_clipping(compose_cfg, tmp_path, family, fused):
    # Lightning turns trainer.precision=16-mixed into bf16-mixed on CPU; its plugin, given directly, keeps fp16
    # autocast and a GradScaler, the path CUDA's 16-mixed takes
    overrides = [
        *FAMILIES[family](tmp_path),
        *SHORT,
        "trainer.precision=null",
        f"task.optimizer.fused={fused}",
    ]
    cfg = compose_cfg(*overrides)
    with open_dict(cfg):
        cfg.trainer.plugins.append(
            {
                "_target_": "lightning.pytorch.plugins.precision.MixedPrecision",
                "precision": "16-mixed",
                "device": "cpu",
                # from 2^16, PPO's first scaled gradients overflow and the scaler skips those steps
                "scaler": {"_target_": "torch.amp.GradScaler", "device": "cpu", "init_scale": 2.0**10},
            }
        )
    assert_trained_with_clipped_gradients(*step_grad_norms(cfg))


def test_bf16_true_trains_with_clipping(compose_cfg, tmp_path):
    cfg = compose_cfg(*FAMILIES["gpt_pretrain"](tmp_path), *SHORT, "trainer.precision=bf16-true")
    assert_trained_with_clipped_gradients(*step_grad_norms(cfg))


def test_gpu_trainer_preset_runs_on_cpu(compose_cfg):
    """trainer=gpu as the README gives it (bf16-mixed, the default clip 1.0), on CPU. trainer=fsdp is left out:
    Lightning's FSDPStrategy, and torch's FSDP, refuse to run without a GPU (benchmarks/gpu_check.sh runs it)."""
    cfg = compose_cfg(*TINY_LM, *SHORT, "trainer=gpu", "trainer.accelerator=cpu")
    assert cfg.trainer.precision == "bf16-mixed" and cfg.trainer.gradient_clip_val == 1.0
    metrics, norms = step_grad_norms(cfg)
    assert len(norms) == 2 and all(n <= 1.0 + 1e-2 for n in norms), norms
    assert all(math.isfinite(v) for v in metrics.values()), metrics
