"""Position information: fixed sinusoidal, learned absolute, rotary (RoPE)."""

from __future__ import annotations

import math

import torch
from torch import nn


def sinusoidal_table(max_len: int, d_model: int, concat: bool = False) -> torch.Tensor:
    """PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(pos / 10000^(2i/d)); (max_len, d_model).

    ``concat`` lays the same values out as [all sines | all cosines] (tensor2tensor, fairseq and Marian/OPUS-MT
    checkpoints) instead of interleaving them as the paper writes it.
    """
    position = torch.arange(max_len, dtype=torch.float64)[:, None]
    inv_freq = torch.exp(-math.log(10000.0) * torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    sin, cos = torch.sin(position * inv_freq), torch.cos(position * inv_freq[: d_model // 2])
    if concat:
        return torch.cat([sin, cos], dim=-1).float()
    table = torch.zeros(max_len, d_model, dtype=torch.float64)
    table[:, 0::2], table[:, 1::2] = sin, cos
    return table.float()


class SinusoidalPositions(nn.Module):
    """Fixed sinusoidal positions of the original Transformer (no parameters)."""

    def __init__(self, max_len: int, d_model: int, concat: bool = False):
        super().__init__()
        self.register_buffer("table", sinusoidal_table(max_len, d_model, concat), persistent=False)

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return self.table[position_ids]  # (B, T, d_model)


class LearnedPositions(nn.Module):
    """Learned absolute position embeddings (GPT-2, BERT, ViT, CLIP)."""

    def __init__(self, max_len: int, d_model: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(max_len, d_model))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return self.weight[position_ids]  # (B, T, d_model)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding applied to queries and keys inside attention (RoFormer).

    Uses the "rotate half" pairing (dimension i with i + hs/2), as GPT-NeoX and LLaMA do.
    """

    def __init__(self, head_dim: int, max_len: int, base: float = 10000.0):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head dimension, got {head_dim}")
        inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        angles = torch.arange(max_len, dtype=torch.float64)[:, None] * inv_freq  # (max_len, hs/2)
        angles = torch.cat([angles, angles], dim=-1)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """x: (B, nh, T, hs), position_ids: (B, T) -> rotated x."""
        cos = self.cos[position_ids][:, None].to(x.dtype)  # (B, 1, T, hs)
        sin = self.sin[position_ids][:, None].to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin


# "sinusoidal_concat": the sinusoidal values in [sines | cosines] layout (Marian/OPUS-MT, fairseq)
POSITION_KINDS = ("learned", "sinusoidal", "sinusoidal_concat", "rope")


def absolute_positions(kind: str, max_len: int, d_model: int) -> nn.Module | None:
    """The module adding positions to token embeddings, or None for RoPE (applied in attention)."""
    if kind not in POSITION_KINDS:
        raise ValueError(f"Unknown position kind {kind!r}; choose one of {POSITION_KINDS}")
    if kind == "learned":
        return LearnedPositions(max_len, d_model)
    if kind.startswith("sinusoidal"):
        return SinusoidalPositions(max_len, d_model, concat=kind == "sinusoidal_concat")
    return None
