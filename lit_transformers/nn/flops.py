"""Counting a model's training FLOPs from its layers, for model FLOPs utilisation (MFU).

A token passing through an ``nn.Linear`` costs 2 FLOPs per weight forward and 4 backward (the gradients of the
input and of the weight): 6 per weight, PaLM's 6N (Chowdhery et al. 2022, appendix B). Attention adds, per
token and layer, 2 * width FLOPs per attended position for the scores and as many for the weighted values,
times 3 with the backward: ``12 * span * width``.
"""

from __future__ import annotations

from torch import nn

TRAINING_FLOPS_PER_WEIGHT = 6  # forward 2 + backward 4, per weight and token


def linear_weights(module: nn.Module) -> int:
    """The weights of every ``nn.Linear`` in ``module`` (biases left out: one addition per output)."""
    return sum(m.weight.numel() for m in module.modules() if isinstance(m, nn.Linear))


def attention_flops(n_layer: int, span: int, width: int) -> int:
    """Training FLOPs per token of ``n_layer`` attention layers over ``span`` positions; ``width`` is the query
    heads times the head size (d_model, unless a head size of its own is set; grouped-query attention repeats
    keys/values for every query head, so it costs the same)."""
    return 12 * n_layer * span * width
