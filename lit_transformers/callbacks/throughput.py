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
        self._last: float | None = None

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._last = None  # validation and checkpointing between epochs are not training time

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        now = time.perf_counter()
        if self._last is not None:
            tokens = batch[self.key].numel() * trainer.world_size
            pl_module.log("train/tokens_per_s", tokens / (now - self._last), on_step=True, on_epoch=False)
        self._last = now
