"""Exact resume: a run resumed from one of its checkpoints trains exactly as the run that went on (same batches,
same dropout masks, same weights), in one process and under DDP."""

from __future__ import annotations

import csv
from pathlib import Path

import lightning as L
import pytest
import torch

from lit_transformers.train import train

from conftest import TINY_LM, compose_train_cfg, two_rank_group

# dropout on, so that a resumed run matches only if it also draws the same random numbers; a validation and a
# checkpoint every 2 steps (TINY_LM), all kept, so validation runs between a checkpoint and the steps compared
EXACT = [
    *TINY_LM,
    "model.dropout=0.1",
    "trainer.deterministic=true",
    "callbacks.model_checkpoint.save_top_k=-1",
    "test=false",
    "sample=null",
]


def _losses(run_dir: Path) -> dict[int, float]:
    with open(run_dir / "csv" / "metrics.csv") as f:
        return {int(r["step"]): float(r["train/loss"]) for r in csv.DictReader(f) if r.get("train/loss")}


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)  # as train.py loads it
    return {k: v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}


def _assert_same_training(straight: Path, resumed: Path, steps: range) -> None:
    expected, got = _losses(straight), _losses(resumed)
    assert sorted(got) == list(steps)  # the resumed run logs the steps after its checkpoint, once each
    assert [got[s] for s in steps] == [expected[s] for s in steps]
    reference = _weights(straight)
    for name, value in _weights(resumed).items():
        torch.testing.assert_close(value, reference[name], rtol=0, atol=0, msg=name)


def _train_in(compose_cfg, run_dir: Path, *overrides: str) -> None:
    cfg = compose_cfg(*EXACT, "trainer.max_steps=8", *overrides)
    cfg.paths.output_dir = str(run_dir)
    cfg.callbacks.model_checkpoint.dirpath = str(run_dir / "checkpoints")
    cfg.logger.csv.save_dir = str(run_dir)
    cfg.trainer.default_root_dir = str(run_dir)
    train(cfg)


@pytest.mark.parametrize(
    "where",
    [
        pytest.param([], id="mid-epoch"),
        # the checkpoint falls on the epoch's last batch: the next epoch draws a fresh order
        pytest.param(["+trainer.limit_train_batches=4"], id="epoch-boundary"),
    ],
)
def test_resume_trains_exactly_as_the_run_that_went_on(compose_cfg, tmp_path, where):
    _train_in(compose_cfg, tmp_path / "straight", *where)
    step_4 = tmp_path / "straight" / "checkpoints" / "step_000004.ckpt"
    _train_in(compose_cfg, tmp_path / "resumed", f"ckpt_path={step_4}", *where)
    _assert_same_training(tmp_path / "straight", tmp_path / "resumed", range(4, 8))


class SeedByRank(L.Callback):
    """A random stream per rank (Lightning seeds every rank alike), so that a rank restored with another rank's
    random state draws other dropout masks."""

    def on_fit_start(self, trainer, pl_module):
        torch.manual_seed(trainer.global_rank)


@two_rank_group
def resumed_under_ddp(root, cache_dir):
    """The straight run, then the run resumed from its step 2, in the session's launch of 2 processes: their
    folders."""
    common = [
        *EXACT,
        "trainer=ddp_cpu",
        "trainer.max_steps=6",
        "+callbacks.seed_by_rank._target_=test_resume.SeedByRank",
    ]
    straight, resumed = root / "straight", root / "resumed"
    step_2 = (
        straight / "checkpoints" / "step_000002.ckpt"
    )  # written by the first run, before the second starts
    configs = [
        compose_train_cfg(*common, output_dir=straight, cache_dir=cache_dir),
        compose_train_cfg(*common, f"ckpt_path={step_2}", output_dir=resumed, cache_dir=cache_dir),
    ]
    return configs, lambda results: (straight, resumed)


@pytest.mark.cli
@pytest.mark.ddp
def test_resume_is_exact_under_ddp(resumed_under_ddp):
    straight, resumed = resumed_under_ddp
    _assert_same_training(straight, resumed, range(2, 6))
