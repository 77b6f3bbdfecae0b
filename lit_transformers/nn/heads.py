"""Heads that sit on a body's hidden states (B, T, d): language model, masked LM, scalar (reward/value),
classifier."""

from __future__ import annotations

import torch
from torch import nn

from lit_transformers.nn.blocks import activation_module


class LMHead(nn.Linear):
    """Hidden states -> vocabulary logits, without bias (GPT-2); its weight may be tied to the embedding."""

    def __init__(self, d_model: int, vocab_size: int):
        super().__init__(d_model, vocab_size, bias=False)


class MaskedLMHead(nn.Module):
    """BERT's MLM head: transform (dense -> the model's activation -> LayerNorm), then a decoder to the
    vocabulary whose weight is tied to the word embeddings and whose bias is its own (``cls.predictions`` in
    Hugging Face)."""

    def __init__(self, d_model: int, vocab_size: int, norm_eps: float = 1e-12, activation: str = "gelu"):
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)
        self.act = activation_module(activation)  # HF's head applies hidden_act, as the FFN does
        self.norm = nn.LayerNorm(d_model, eps=norm_eps)
        self.decoder = nn.Linear(d_model, vocab_size, bias=False)  # weight tied by the model
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., d) hidden states of the positions to predict -> (..., vocab_size) logits."""
        return self.decoder(self.norm(self.act(self.dense(hidden)))) + self.bias


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


class ClassifierHead(nn.Sequential):
    """Features (..., d) -> dropout -> linear -> class logits (..., num_classes): on a body's pooled [CLS]
    (sentence classification) or on every hidden state (token classification).

    BERT's fine-tuning init: weight N(0, 0.02), zero bias. State-dict names ``1.weight``, ``1.bias``.
    """

    def __init__(self, d_model: int, num_classes: int, dropout: float = 0.1):
        super().__init__(nn.Dropout(dropout), nn.Linear(d_model, num_classes))
        nn.init.normal_(self[1].weight, std=0.02)
        nn.init.zeros_(self[1].bias)
