"""Heads that sit on a body's hidden states (B, T, d): language model, scalar (reward/value), classifier."""

from __future__ import annotations

import torch
from torch import nn


class LMHead(nn.Linear):
    """Hidden states -> vocabulary logits, without bias (GPT-2); its weight may be tied to the embedding."""

    def __init__(self, d_model: int, vocab_size: int):
        super().__init__(d_model, vocab_size, bias=False)


class ScalarHead(nn.Module):
    """Hidden states (..., d) -> one number each (...): the reward model's score, PPO's value.

    Init std 1/sqrt(d + 1) and zero bias, as in the InstructGPT/TRL reward models: initial scores are
    small and centred, so the first comparisons do not saturate the sigmoid.
    """

    def __init__(self, d_model: int):
        super().__init__()
        self.proj = nn.Linear(d_model, 1)
        nn.init.normal_(self.proj.weight, std=1 / (d_model + 1) ** 0.5)
        nn.init.zeros_(self.proj.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.proj(hidden).squeeze(-1)


class ClassifierHead(nn.Module):
    """BERT's pooler ``tanh(W h_[CLS])`` -> dropout -> linear to class logits.

    ``forward`` takes the hidden states (B, T, d) and reads the first ([CLS]) position.
    """

    def __init__(self, d_model: int, num_classes: int, dropout: float = 0.1):
        super().__init__()
        self.pooler = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(d_model, num_classes)

    def pool(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.pooler(hidden[:, 0]))  # (B, d)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(self.pool(hidden)))  # (B, num_classes)
