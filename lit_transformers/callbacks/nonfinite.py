"""Stop training with a clear message when the loss turns NaN/inf, before it poisons the weights."""

from __future__ import annotations

import lightning as L
import torch


class NonFiniteLossError(FloatingPointError):
    pass


class StopOnNonFiniteLoss(L.Callback):
    def on_before_backward(self, trainer, pl_module, loss: torch.Tensor) -> None:
        # all ranks decide together, so one rank's NaN does not leave the others waiting in all-reduce
        bad = trainer.strategy.reduce_boolean_decision(not bool(torch.isfinite(loss).all()), all=False)
        if bad:
            raise NonFiniteLossError(
                f"Non-finite training loss ({loss.item()}) at global step {trainer.global_step}; the step was not "
                "applied and no checkpoint was written for it. Lower the learning rate (task.optimizer.lr), keep "
                "gradient clipping on (trainer.gradient_clip_val), or use precision=bf16-mixed instead of 16-mixed. "
                "Resume from the last good checkpoint with ckpt_path=<run>/checkpoints/last.ckpt."
            )
