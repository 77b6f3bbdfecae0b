"""Training throughput in tokens per second, summed over ranks.

Lightning's ``ThroughputMonitor`` reports samples and items under its own names and needs a
``length_fn``; dashboards here expect one number, ``train/tokens_per_s``, so this stays a few lines.
"""

from __future__ import annotations

import time

import lightning as L


class TokensPerSecond(L.Callback):
    def __init__(self, key: str = "input_ids"):
        self.key = key
        self._last: float | None = None  # end of the previous step, moved later by the pauses since
        self._paused: float | None = None  # when the clock stopped

    # validation, checkpoint writing and the turn of an epoch are not training time: they stop the clock, and
    # the next training batch restarts it
    def _pause(self) -> None:
        if self._paused is None:
            self._paused = time.perf_counter()

    def on_validation_start(self, trainer, pl_module) -> None:
        self._pause()

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self._pause()

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._pause()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._paused is not None and self._last is not None:
            self._last += time.perf_counter() - self._paused
        self._paused = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        now = time.perf_counter()
        if self._last is not None:
            tokens = batch[self.key].numel() * trainer.world_size
            pl_module.log("train/tokens_per_s", tokens / (now - self._last), on_step=True, on_epoch=False)
        self._last = now
