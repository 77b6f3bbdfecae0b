"""Throughput counts a model's weights once per fit, after LoRA has added its adapters: per step only the
attention's part of the FLOPs is counted, and MFU is of the model that trains (the adapters' FLOPs included)."""

from __future__ import annotations

import csv

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader

from lit_transformers.callbacks.throughput import Throughput
from lit_transformers.models import GPT, GPTConfig
from lit_transformers.tasks.causal_lm import CausalLMTask

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

SPEC = dict(vocab_size=64, block_size=16, n_layer=2, n_head=2, d_model=16)
PEAK = 1e12  # FLOP/s: MFU * PEAK / tokens_per_sec is the FLOPs per token Throughput counted
STEPS = 4


def _fit(tmp_path, lora: dict | None) -> tuple[CausalLMTask, list[dict[str, str]]]:
    """A few steps of a tiny GPT from a saved base (LoRA needs one), logging each step's rates to a CSV."""
    torch.manual_seed(0)
    base = tmp_path / "base.pt"
    torch.save(GPT(GPTConfig(**SPEC)).state_dict(), base)
    task = CausalLMTask(
        model=GPTConfig(**SPEC),
        optimizer={"_target_": "torch.optim.AdamW", "lr": 1e-3},
        init_from=str(base),
        lora=lora,
    )
    rows = torch.randint(0, SPEC["vocab_size"], (2 * STEPS, SPEC["block_size"] + 1))
    batches = DataLoader([{"input_ids": r[:-1], "labels": r[1:]} for r in rows], batch_size=2)
    trainer = L.Trainer(
        max_steps=STEPS,
        callbacks=[Throughput(peak_flops=PEAK)],
        logger=CSVLogger(tmp_path, name="csv", version=0),
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    trainer.fit(task, batches)
    with open(tmp_path / "csv" / "version_0" / "metrics.csv") as f:
        return task, [row for row in csv.DictReader(f) if row.get("train/mfu")]


def test_weights_are_counted_once_per_fit(tmp_path, monkeypatch):
    walks = []
    num_params = GPT.num_params
    monkeypatch.setattr(GPT, "num_params", lambda self, **kw: walks.append(1) or num_params(self, **kw))
    _, logged = _fit(tmp_path, lora=None)
    assert len(logged) == STEPS - 1  # the first step starts the clock
    assert len(walks) == 1


def test_mfu_counts_the_lora_adapters_added_at_configure_model(tmp_path):
    task, logged = _fit(tmp_path, lora={"r": 4})
    seq_len = SPEC["block_size"]
    base = GPT(GPTConfig(**SPEC)).flops_per_token(seq_len)
    trained = task.model.flops_per_token(seq_len)  # the adapters are weights every token passes through
    assert trained > base
    for row in logged:
        counted = float(row["train/mfu"]) * PEAK / float(row["train/tokens_per_sec"])
        assert counted == pytest.approx(trained, rel=1e-5)
