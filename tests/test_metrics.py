"""Metrics that mean what they say: evaluation counts every sample once under DDP, and tokens/s times training
only."""

from __future__ import annotations

import csv
import time
from pathlib import Path

import lightning as L
import pytest

from lit_transformers.train import train

from conftest import TINY_LM, train_cli


def _rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "csv" / "metrics.csv") as f:
        return list(csv.DictReader(f))


def _last(rows: list[dict[str, str]], key: str) -> float:
    return [float(r[key]) for r in rows if r.get(key)][-1]


class SlowValidation(L.Callback):
    """A validation that lasts over a second; notes when each ran and when each training step ended."""

    validations: list[tuple[float, float]] = []
    step_ends: dict[int, float] = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.step_ends[batch_idx] = time.perf_counter()

    def on_validation_start(self, trainer, pl_module):
        self.started = time.perf_counter()

    def on_validation_end(self, trainer, pl_module):
        time.sleep(1.0)
        self.validations.append((self.started, time.perf_counter()))


def test_tokens_per_s_leaves_out_validation_and_checkpoint_time(compose_cfg, tmp_path):
    cfg = compose_cfg(
        *TINY_LM,
        "+callbacks.slow._target_=test_metrics.SlowValidation",
        "trainer.max_steps=7",
        "trainer.val_check_interval=4",  # one validation (and checkpoint) mid-run
        "trainer.num_sanity_val_steps=0",
        "test=false",
        "sample=null",
    )
    train(cfg)
    rows = _rows(tmp_path)
    rates = {int(r["step"]): float(r["train/tokens_per_s"]) for r in rows if r.get("train/tokens_per_s")}
    assert sorted(rates) == [1, 2, 3, 4, 5, 6]  # every step but the first, which has no start to time from
    (val_start, val_end), ends = SlowValidation.validations[0], SlowValidation.step_ends
    assert ends[3] < val_start < val_end < ends[4]
    # step 4 was timed over less than the time between the ends of steps 3 and 4 minus the validation: both sides
    # are clock readings of the same run, so a loaded machine slows them alike
    tokens = cfg.data.batch_size * cfg.data.block_size
    assert tokens / rates[4] < ends[4] - ends[3] - (val_end - val_start) + 0.05, rates


def test_ddp_evaluation_counts_every_window_once(compose_cfg, tmp_path, cache_dir):
    """2 ranks give the val and test loss of 1 process on the same weights: no window is repeated to even out
    the ranks (here, where the split has an odd number of windows, a repeat would move val/loss by 7.5e-6)."""
    cfg = compose_cfg(*TINY_LM, "test=false", "sample=null")
    cfg.callbacks.model_checkpoint.dirpath = str(tmp_path / "parent")
    train(cfg)
    # lr 0 and no weight decay: one step leaves the parent's weights as they are; then validate and test them all
    evaluate = [
        *TINY_LM,
        f"init_from={tmp_path / 'parent' / 'last.ckpt'}",
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
    two = tmp_path / "two"
    result = train_cli(
        *evaluate,
        "trainer=ddp_cpu",
        f"hydra.run.dir={two}",
        f"paths.log_dir={tmp_path}",
        f"paths.cache_dir={cache_dir}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    single, ddp = _rows(tmp_path / "one"), _rows(two)
    for key in ("val/loss", "val/ppl", "test/loss", "test/ppl"):
        assert _last(ddp, key) == pytest.approx(_last(single, key), rel=2e-6), key
