"""Optimiser parameter groups, gradient clipping in every precision, and the learning-rate schedules shared by
every task: warmup + cosine (GPT, ViT, CLIP), warmup + linear decay (BERT) and the Transformer paper's inverse
square root (translation)."""

from __future__ import annotations

import logging
import math
from functools import partial

import lightning as L
from lightning.fabric.plugins.precision.amp import _optimizer_handles_unscaling
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from lightning.pytorch.strategies import FSDPStrategy
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

log = logging.getLogger(__name__)


def decay_groups(module: nn.Module, skip: set[str] | frozenset[str] = frozenset()) -> list[dict]:
    """Weight decay on matrices (Linear/embedding weights) only, as in GPT-2/nanoGPT: biases, norms,
    scalars and any parameter named in ``skip`` (timm's ``no_weight_decay()``) go in a no-decay group."""
    decay, no_decay = [], []
    for name, param in module.named_parameters():
        if not param.requires_grad:
            continue
        if param.ndim < 2 or name in skip or name.split(".")[-1] in skip:
            no_decay.append(param)
        else:
            decay.append(param)
    return [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]


def unrefused_clipping(trainer: L.Trainer, optimizer: Optimizer) -> dict:
    """The precision plugin's methods to replace, around Lightning's clipping (``Task.clip_gradients``), where
    Lightning refuses the clip the GPU presets ask for; {} where its own works:

    - a fused optimizer under autocast (``MixedPrecision``), refused because the fused step unscales a
      GradScaler's gradients itself. Without a scaler (bf16-mixed) there is nothing to unscale; with one
      (16-mixed) they are unscaled here, and the scaler then tells the fused step that they already are
      (``torch.amp.GradScaler.step``). Then the base plugin's clip.
    - clipping by norm under FSDP (``FSDPPrecision``), refused because each rank holds a shard of the
      gradients: the root FSDP module's ``clip_grad_norm_`` takes the norm over all of them.
    """
    precision, strategy = trainer.precision_plugin, trainer.strategy
    if isinstance(strategy, FSDPStrategy):
        return {"clip_grad_by_norm": lambda optimizer, clip_val: strategy.model.clip_grad_norm_(clip_val)}
    if type(precision) is MixedPrecision and _optimizer_handles_unscaling(optimizer):
        if precision.scaler is not None:  # the optimizer the scaler steps, not a manual step's wrapper
            precision.scaler.unscale_(getattr(optimizer, "optimizer", optimizer))
        return {"clip_gradients": partial(Precision.clip_gradients, precision)}
    return {}


def _fit_warmup(total_steps: int, warmup_steps: int) -> tuple[int, int]:
    """(total, warmup) steps, warmup cut to the run's length with a warning when training is shorter."""
    total_steps = max(int(total_steps), 1)
    if warmup_steps > total_steps:
        log.warning(
            "Warmup (%d steps) is longer than training (%d steps); warming up over %d steps instead. "
            "Lower task.scheduler.warmup_steps or raise trainer.max_steps.",
            warmup_steps,
            total_steps,
            total_steps,
        )
    return total_steps, min(int(warmup_steps), total_steps)


def warmup_cosine(
    optimizer: Optimizer, total_steps: int, warmup_steps: int = 100, min_lr_ratio: float = 0.1
) -> LambdaLR:
    """Linear warmup over ``warmup_steps`` (step s uses lr * (s + 1) / warmup_steps, so the first step
    already moves and step warmup_steps - 1 reaches the peak), then cosine down to ``min_lr_ratio`` * lr at
    ``total_steps``. Per-group lrs (layer-wise decay) are scaled alike."""
    total_steps, warmup_steps = _fit_warmup(total_steps, warmup_steps)

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return LambdaLR(optimizer, factor)


def warmup_linear(optimizer: Optimizer, total_steps: int, warmup_steps: int = 100) -> LambdaLR:
    """BERT's schedule: linear warmup over ``warmup_steps`` (as :func:`warmup_cosine`), then linear decay to
    zero at ``total_steps``."""
    total_steps, warmup_steps = _fit_warmup(total_steps, warmup_steps)

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))

    return LambdaLR(optimizer, factor)


def inverse_sqrt(
    optimizer: Optimizer, total_steps: int, d_model: int = 512, warmup_steps: int = 4000
) -> LambdaLR:
    """The schedule of "Attention Is All You Need": lr = scale * d_model^-0.5 * min(s^-0.5, s * warmup^-1.5)
    at step s = 1, 2, ... (a linear rise, then decay as 1 / sqrt(s)). The optimizer's ``lr`` is the scale
    (1.0: the paper's; the peak, at s = warmup, is scale * (d_model * warmup)^-0.5)."""
    _, warmup_steps = _fit_warmup(total_steps, warmup_steps)

    def factor(step: int) -> float:
        s = step + 1
        return d_model**-0.5 * min(s**-0.5, s * warmup_steps**-1.5)

    return LambdaLR(optimizer, factor)
