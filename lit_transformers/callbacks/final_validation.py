"""Validate after the last step of a step-limited run, so its final weights are always judged."""

from __future__ import annotations

import lightning as L


class ValidateAfterLastStep(L.Callback):
    """Without this, a run whose ``max_steps`` is not a multiple of ``val_check_interval`` ends unvalidated:
    no best checkpoint to test, no ``val/*`` metric for ``optimized_metric``. Setting ``trainer.should_stop`` on
    the last step takes Lightning's early-stopping path, which validates before stopping, so ModelCheckpoint
    saves the best and last checkpoints as at any other validation (once: a scheduled one is not repeated).
    That path still skips epochs that ``check_val_every_n_epoch`` does not name, so every preset counts
    validation in steps (``check_val_every_n_epoch: null``)."""

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx
    ) -> None:
        if trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps:
            trainer.should_stop = True
