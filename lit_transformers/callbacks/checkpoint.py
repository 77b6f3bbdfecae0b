"""Lightning's ModelCheckpoint with ``last.ckpt`` always the newest state."""

from __future__ import annotations

import logging
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lit_transformers.callbacks.interrupt import Interrupted

log = logging.getLogger(__name__)


class NewestLastCheckpoint(ModelCheckpoint):
    """With ``save_last``, Lightning (2.6) rewrites ``last.ckpt`` only when it writes a top-k checkpoint at the
    same step: a validation that does not improve the monitored metric left ``last.ckpt`` behind, and a resume
    from it silently repeated every step since. Here every point where Lightning considers saving (each
    validation, or each train epoch end when it saves there; a run always validates after its last step)
    writes ``last.ckpt`` when Lightning's own pass did not. A run that crashes says which step it holds."""

    def __init__(
        self,
        dirpath: str | None = None,
        filename: str = "step_{step:06d}",
        save_last: bool = True,
        auto_insert_metric_name: bool = False,
        **kwargs,
    ):
        super().__init__(
            dirpath, filename, save_last=save_last, auto_insert_metric_name=auto_insert_metric_name, **kwargs
        )

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if not self._should_save_on_train_epoch_end(trainer):
            self._save_last_if_behind(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if self._should_save_on_train_epoch_end(trainer):
            self._save_last_if_behind(trainer)

    def _save_last_if_behind(self, trainer: L.Trainer) -> None:
        # skipped too when Lightning's pass saved at this step (its top-k, and last.ckpt with it)
        if self.save_last and not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        super().on_exception(trainer, pl_module, exception)
        last = Path(self.last_model_path) if self.last_model_path else None
        if (
            isinstance(exception, Interrupted)
            or not trainer.is_global_zero
            or last is None
            or not last.is_file()
        ):
            return  # a stop by signal says so itself, having saved the step it stopped at
        step = torch.load(last, map_location="cpu", weights_only=True, mmap=True)["global_step"]
        log.error(
            "%s at step %d; %s holds step %d: resume from it with ckpt_path=%s",
            type(exception).__name__, trainer.global_step, last, step, last,
        )  # fmt: skip
