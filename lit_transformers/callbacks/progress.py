"""A progress bar that counts optimizer steps when training is limited by ``trainer.max_steps``."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar


class StepProgressBar(RichProgressBar):
    """``step ━━━━━ 120/5000`` across epochs for step-limited runs (Lightning's bar restarts every epoch and reads
    ``Epoch 19/-2`` when ``max_epochs=-1``); epoch-limited runs keep Lightning's per-epoch bar."""

    def _by_steps(self) -> bool:
        return self.trainer.max_epochs == -1 and (self.trainer.max_steps or 0) > 0

    @property
    def total_train_batches(self) -> int | float:
        return self.trainer.max_steps if self._by_steps() else super().total_train_batches

    def _get_train_description(self, current_epoch: int) -> str:
        if not self._by_steps():
            return super()._get_train_description(current_epoch)
        return f"{'step':{len(self.validation_description)}}"  # aligned with the validation bar below

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._by_steps():
            return super().on_train_epoch_start(trainer, pl_module)
        if self.train_progress_bar_id is None:  # one bar for the whole run, not one per epoch
            super().on_train_epoch_start(trainer, pl_module)
            if self.progress is not None:  # a resumed run starts where it left off, without a speed spike
                self.progress.reset(
                    self.train_progress_bar_id, total=trainer.max_steps, completed=trainer.global_step
                )

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx
    ) -> None:
        # the parent draws ``batch_idx + 1`` batches done; in step mode the count is the global step
        position = trainer.global_step - 1 if self._by_steps() else batch_idx
        super().on_train_batch_end(trainer, pl_module, outputs, batch, position)
