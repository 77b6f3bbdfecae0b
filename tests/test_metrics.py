"""Metrics that mean what they say: evaluation counts every sample once under DDP (logged to every dashboard, in
one run folder), and tokens/s times training only."""

from __future__ import annotations

import csv
from pathlib import Path

import lightning as L
import pytest
import torch
from omegaconf import OmegaConf

from lit_transformers.callbacks.throughput import Throughput
from lit_transformers.train import train

from conftest import TINY_LM


def _rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "csv" / "metrics.csv") as f:
        return list(csv.DictReader(f))


def _last(rows: list[dict[str, str]], key: str) -> float:
    return [float(r[key]) for r in rows if r.get(key)][-1]


class HandClock(L.Callback):
    """Gives the tokens/s callback a clock that moves only here: 1 s inside each training step, 100 s for each
    validation batch, 1000 s when validation ends (before the checkpoint is written) and at each epoch's end."""

    def __init__(self):
        self.now = 0.0

    def on_fit_start(self, trainer, pl_module):
        (throughput,) = [c for c in trainer.callbacks if isinstance(c, Throughput)]
        # its hooks run before these, so it has stopped its clock when this one moves it outside training
        assert trainer.callbacks.index(throughput) < trainer.callbacks.index(self)
        throughput.clock = lambda: self.now

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.now += 1.0

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self.now += 100.0

    def on_validation_end(self, trainer, pl_module):
        self.now += 1000.0

    def on_train_epoch_end(self, trainer, pl_module):
        self.now += 1000.0


def test_tokens_per_s_counts_training_time_only(compose_cfg, tmp_path):
    cfg = compose_cfg(
        *TINY_LM,
        "+callbacks.hand_clock._target_=test_metrics.HandClock",
        "trainer.max_steps=7",
        "+trainer.limit_train_batches=3",  # epochs end after steps 3 and 6
        "trainer.val_check_interval=4",  # one validation (and checkpoint) after step 4
        "callbacks.model_checkpoint.save_top_k=-1",
        "trainer.num_sanity_val_steps=0",
        "test=false",
        "sample=null",
    )
    train(cfg)
    rows = _rows(tmp_path)
    assert [int(r["step"]) for r in rows if r.get("val/loss")] == [3, 6]  # mid-run, and after the last step
    assert (tmp_path / "checkpoints" / "step_000004.ckpt").is_file()
    rates = {int(r["step"]): float(r["train/tokens_per_sec"]) for r in rows if r.get("train/tokens_per_sec")}
    # every step but the first (no start to time from) ran 1 s of training, whatever happened between steps
    tokens = cfg.data.batch_size * cfg.data.block_size
    assert rates == {step: tokens / 1.0 for step in range(1, 7)}


@pytest.mark.cli
@pytest.mark.ddp
def test_ddp_run_counts_every_window_once_and_logs_to_every_dashboard_in_one_run_folder(
    compose_cfg, ddp_cli, tiny_lm_run, tmp_path
):
    """2 ranks give the val and test loss of 1 process on the same weights: no window is repeated to even out
    the ranks (here, where the split has an odd number of windows, a repeat would move val/loss by 7.5e-6). Both
    ranks write into the one run folder, where CSV, TensorBoard and wandb each log."""
    # lr 0 and no weight decay: one step leaves the parent's weights as they are; then validate and test them all
    evaluate = [
        *TINY_LM,
        f"init_from={tiny_lm_run / 'checkpoints' / 'last.ckpt'}",
        "task.optimizer.lr=0",
        "task.optimizer.weight_decay=0",
        "trainer.max_steps=1",
        "trainer.val_check_interval=1",
        "trainer.limit_val_batches=1.0",
        "trainer.limit_test_batches=1.0",
        "trainer.num_sanity_val_steps=0",
        "sample=null",
        "callbacks.text_samples=null",
    ]
    one = compose_cfg(*evaluate)
    one.paths.output_dir = str(tmp_path / "one")
    one.callbacks.model_checkpoint.dirpath = str(tmp_path / "one" / "checkpoints")
    one.logger.csv.save_dir = str(tmp_path / "one")
    train(one)
    run_dir = ddp_cli(*evaluate, "logger=many")
    single, ddp = _rows(tmp_path / "one"), _rows(run_dir)
    for key in ("val/loss", "val/ppl", "test/loss", "test/ppl"):
        assert _last(ddp, key) == pytest.approx(_last(single, key), rel=2e-6), key

    assert (run_dir / "train_ddp_process_1.log").is_file()  # rank 1 wrote into the same run folder
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ddp", "one"]  # no second run folder
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert list((run_dir / "wandb").glob("offline-run-*"))
    resolved = OmegaConf.load(run_dir / "config_resolved.yaml")
    assert resolved.trainer.devices == 2 and "${" not in OmegaConf.to_yaml(resolved)
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 1
