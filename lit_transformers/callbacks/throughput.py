"""Training throughput in tokens per second, summed over ranks, and model FLOPs utilisation.

Lightning's ``ThroughputMonitor`` reports samples and items under its own names and needs a
``length_fn``; dashboards here expect ``train/tokens_per_s`` and ``train/mfu``, so this stays a few lines.
"""

from __future__ import annotations

import time

import lightning as L
import torch
from lightning.fabric.utilities.throughput import get_available_flops


def matmul_flops(
    device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, n: int = 2048
) -> float:
    """This device's measured FLOP/s on a large (n x n x n) matmul: the best of a few, after a warm-up."""
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(4):
        if a.is_cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        torch.mm(a, b)
        if a.is_cuda:
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


class TokensPerSecond(L.Callback):
    """``train/tokens_per_s`` over training time only, and ``train/mfu`` when the model states its training
    FLOPs per token (``model.flops_per_token()``, e.g. GPT): achieved FLOP/s over ``peak_flops`` per device.

    ``peak_flops`` None: Lightning's table of known accelerators (datasheet peak at the run's precision), else a
    one-off matmul measurement on the device (CPUs, unlisted GPUs), so MFU is against what this machine does.
    """

    def __init__(self, key: str = "input_ids", peak_flops: float | None = None):
        self.key = key
        self.peak_flops = peak_flops
        self._flops_per_token: int | None = None
        self._last: float | None = None  # end of the previous step, moved later by the pauses since
        self._paused: float | None = None  # when the clock stopped
        self.clock = time.perf_counter  # seconds; a test swaps in a clock it moves by hand

    def on_fit_start(self, trainer, pl_module) -> None:
        flops = getattr(getattr(pl_module, "model", None), "flops_per_token", None)
        self._flops_per_token = flops() if flops else None
        if self._flops_per_token and self.peak_flops is None:
            precision = str(trainer.precision)
            dtype = (
                torch.bfloat16
                if "bf16" in precision
                else torch.float16
                if "16" in precision
                else torch.float32
            )
            self.peak_flops = get_available_flops(pl_module.device, dtype) or matmul_flops(
                pl_module.device, dtype
            )

    # validation, checkpoint writing and the turn of an epoch are not training time: they stop the clock, and
    # the next training batch restarts it
    def _pause(self) -> None:
        if self._paused is None:
            self._paused = self.clock()

    def on_validation_start(self, trainer, pl_module) -> None:
        self._pause()

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self._pause()

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._pause()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._paused is not None and self._last is not None:
            self._last += self.clock() - self._paused
        self._paused = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        now = self.clock()
        if self._last is not None:
            rate = batch[self.key].numel() * trainer.world_size / (now - self._last)
            pl_module.log("train/tokens_per_s", rate, on_step=True, on_epoch=False)
            if self._flops_per_token:
                mfu = rate * self._flops_per_token / (self.peak_flops * trainer.world_size)
                pl_module.log("train/mfu", mfu, on_step=True, on_epoch=False)
        self._last = now
