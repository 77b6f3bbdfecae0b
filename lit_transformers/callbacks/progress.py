"""A progress bar that counts optimizer steps when training is limited by ``trainer.max_steps``."""

from __future__ import annotations

import math

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar


def progress_count(trainer: L.Trainer) -> tuple[str, int, int]:
    """(unit, done, total) of a training: optimizer steps, or the iterations of a task whose training batch steps
    the optimizer several times and says how many in ``optimizer_steps_per_batch`` (PPO), the axis its scalars
    are logged on."""
    per_batch = getattr(trainer.lightning_module, "optimizer_steps_per_batch", 1)
    steps = trainer.max_steps if trainer.max_steps > 0 else trainer.estimated_stepping_batches
    unit = "step" if per_batch == 1 else "iteration"
    return unit, trainer.global_step // per_batch, math.ceil(steps / per_batch)


class StepProgressBar(RichProgressBar):
    """``step ━━━━━ 120/5000`` across epochs for step-limited runs (Lightning's bar restarts every epoch and reads
    ``Epoch 19/-2`` when ``max_epochs=-1``); epoch-limited runs keep Lightning's per-epoch bar.

    A task whose training batch steps the optimizer several times (PPO: one iteration, ``num_ppo_epochs x
    num_mini_batches`` steps) says how many in ``optimizer_steps_per_batch``; the bar then counts its
    iterations, the axis its scalars and tables are logged on, up to the iterations ``max_steps`` allows."""

    def _by_steps(self) -> bool:
        return self.trainer.max_epochs == -1 and (self.trainer.max_steps or 0) > 0

    @property
    def total_train_batches(self) -> int | float:
        return progress_count(self.trainer)[2] if self._by_steps() else super().total_train_batches

    def _get_train_description(self, current_epoch: int) -> str:
        if not self._by_steps():
            return super()._get_train_description(current_epoch)
        unit = progress_count(self.trainer)[0]
        return f"{unit:{len(self.validation_description)}}"  # aligned with the validation bar below

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._by_steps():
            return super().on_train_epoch_start(trainer, pl_module)
        if self.train_progress_bar_id is None:  # one bar for the whole run, not one per epoch
            super().on_train_epoch_start(trainer, pl_module)
            if self.progress is not None:  # a resumed run starts where it left off, without a speed spike
                _, done, total = progress_count(trainer)
                self.progress.reset(self.train_progress_bar_id, total=total, completed=done)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx
    ) -> None:
        # the parent draws ``batch_idx + 1`` batches done; in step mode the steps (or iterations) done
        position = progress_count(trainer)[1] - 1 if self._by_steps() else batch_idx
        super().on_train_batch_end(trainer, pl_module, outputs, batch, position)
