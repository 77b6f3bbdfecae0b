"""Training on 2 DDP CPU ranks, in the session's one launch (conftest.two_rank_group): the trainer=ddp preset of
the GPU recipes first in it, so that its strategy starts the process group, then a PPO stage (manual optimization,
generation on every rank) on trainer=ddp_cpu."""

from __future__ import annotations

import csv
import math

import pytest
from test_precision import SHORT

from conftest import TINY_LM, compose_train_cfg, two_rank_group
from test_instructgpt import TINY, TINY_DATA, TINY_TASK

RUNS = {
    # trainer=ddp as the README gives it (its strategy, bf16-mixed, the default clip), on CPUs, with gloo for NCCL
    "ddp_preset": [
        *TINY_LM,
        *SHORT,
        "trainer=ddp",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "trainer.strategy.process_group_backend=gloo",
    ],
    "ppo": [
        "experiment=gpt_ppo",
        *TINY,
        *TINY_DATA,
        *TINY_TASK,
        "trainer.max_steps=4",
        "test=false",
        "trainer=ddp_cpu",
    ],
}


@two_rank_group(first=True)
def two_rank_runs(root, cache_dir):
    """Each of RUNS, in order, first in the session's launch of 2 processes: its run folder."""
    configs = [
        compose_train_cfg(*overrides, output_dir=root / name, cache_dir=cache_dir)
        for name, overrides in RUNS.items()
    ]
    return configs, lambda results: {name: root / name for name in RUNS}


@pytest.mark.cli
@pytest.mark.ddp
def test_ddp_trainer_preset_runs_on_two_cpu_processes(two_rank_runs):
    rows = list(csv.DictReader((two_rank_runs["ddp_preset"] / "csv" / "metrics.csv").open()))
    losses = [float(row["train/loss"]) for row in rows if row.get("train/loss")]
    assert len(losses) == 2 and all(math.isfinite(v) for v in losses), rows


@pytest.mark.cli
@pytest.mark.ddp
def test_ppo_under_ddp_cpu(two_rank_runs):
    assert (two_rank_runs["ppo"] / "checkpoints" / "last.ckpt").is_file()
