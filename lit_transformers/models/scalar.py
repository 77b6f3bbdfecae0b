"""A GPT body with a scalar head: the reward model (one score per sequence) and PPO's value model (one value
per token). State-dict names are ``body.*`` (a GPT's, so a GPT checkpoint initialises the body) + ``head.*``."""

from __future__ import annotations

import torch
from torch import nn

from lit_transformers.models.gpt import GPT, GPTConfig
from lit_transformers.nn import ScalarHead, last_true_index
from lit_transformers.nn.generation import padded_forward


class ScalarGPT(nn.Module):
    def __init__(self, config: GPTConfig, body: GPT | None = None):
        """``body``: a GPT of ``config`` to put the head on (a loaded decoder); None builds a new one."""
        super().__init__()
        self.config = config
        self.body = GPT(config) if body is None else body
        self.head = ScalarHead(config.d_model)  # init std 1/sqrt(d + 1), bias 0

    def forward(self, idx: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """idx, attention_mask (B, T) -> per-token values (B, T), under the padding-aware mask and positions
        that generation uses (left or right padding)."""
        return self.head(padded_forward(self.body.hidden_states, idx, attention_mask))

    def score(self, idx: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B,) the value at each row's last real (non-pad) token: the reward of the whole sequence."""
        values = self(idx, attention_mask)
        return values[torch.arange(idx.size(0), device=idx.device), last_true_index(attention_mask)]
