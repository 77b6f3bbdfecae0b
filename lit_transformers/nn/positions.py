"""Position information: fixed sinusoidal, learned absolute, rotary (RoPE)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
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
        self.max_len, self.d_model, self.concat = max_len, d_model, concat
        self.reset_buffers()

    def reset_buffers(self) -> None:
        """Compute the table (again, for a module built on the meta device)."""
        table = sinusoidal_table(self.max_len, self.d_model, self.concat)
        self.register_buffer("table", table, persistent=False)

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return self.table[position_ids]  # (B, T, d_model)


class LearnedPositions(nn.Module):
    """Learned absolute position embeddings (GPT-2, BERT, ViT, CLIP)."""

    def __init__(self, max_len: int, d_model: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(max_len, d_model))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        # F.embedding, not self.weight[position_ids]: indexing's backward (an accumulating index_put) sums the
        # gradients of repeated positions in a thread-dependent order on CPU, so two runs of one command differed
        return F.embedding(position_ids, self.weight)  # (B, T, d_model)


# Hugging Face ``rope_scaling`` types (``rope_type``) we compute, each with the keys it needs: linear divides the
# positions by factor (Chen et al. 2023, position interpolation); dynamic raises the base once a sequence
# grows past the original length (NTK-aware); llama3 slows the long wavelengths alone (Llama 3.1)
ROPE_SCALINGS = {
    "linear": ("factor",),
    "dynamic": ("factor", "original_max_position_embeddings"),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}


def rope_type(scaling: dict | None) -> str | None:
    """The type of a Hugging Face ``rope_scaling`` (``rope_type``; older files say ``type``), None without one."""
    return scaling.get("rope_type", scaling.get("type")) if scaling else None


def check_rope_scaling(scaling: dict | None) -> None:
    """Refuse, by name, a ``rope_scaling`` of a type we do not compute or lacking one of its keys."""
    if not scaling:
        return
    kind = rope_type(scaling)
    if kind not in ROPE_SCALINGS:
        raise ValueError(
            f"Unsupported rope_scaling type {kind!r} (rope_scaling={scaling}); supported: "
            f"{sorted(ROPE_SCALINGS)} (or rope_scaling=null for plain RoPE)"
        )
    lacking = [key for key in ROPE_SCALINGS[kind] if key not in scaling]
    if lacking:
        raise ValueError(f"rope_scaling of type {kind!r} lacks {lacking}; set them (rope_scaling={scaling})")


def rope_inv_freq(head_dim: int, base: float, scaling: dict | None = None, seq_len: int = 0) -> torch.Tensor:
    """(head_dim / 2,) float64 rotation frequencies base^(-2i/hs), adjusted as Hugging Face's ``rope_scaling``
    (``modeling_rope_utils``) does; ``dynamic`` depends on the longest sequence ``seq_len`` of the forward."""
    check_rope_scaling(scaling)
    kind = rope_type(scaling)
    if kind == "dynamic" and seq_len > scaling["original_max_position_embeddings"]:
        factor, original = scaling["factor"], scaling["original_max_position_embeddings"]
        base = base * (factor * seq_len / original - (factor - 1)) ** (head_dim / (head_dim - 2))
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    if kind == "linear":
        inv_freq = inv_freq / scaling["factor"]
    if kind == "llama3":  # long wavelengths slowed by factor, short ones kept, a smooth blend between
        factor, original = scaling["factor"], scaling["original_max_position_embeddings"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        wavelength = 2 * math.pi / inv_freq
        smooth = ((original / wavelength - low) / (high - low)).clamp(0, 1)
        inv_freq = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    return inv_freq


class RotaryEmbedding(nn.Module):
    """Rotary position embedding applied to queries and keys inside attention (RoFormer).

    Uses the "rotate half" pairing (dimension i with i + hs/2), as GPT-NeoX and LLaMA do. ``base`` is
    Hugging Face's ``rope_theta``; ``scaling`` its ``rope_scaling`` (see :data:`ROPE_SCALINGS`).
    """

    def __init__(self, head_dim: int, max_len: int, base: float = 10000.0, scaling: dict | None = None):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head dimension, got {head_dim}")
        self.head_dim, self.max_len, self.base, self.scaling = head_dim, max_len, base, scaling
        self.reset_buffers()

    def reset_buffers(self) -> None:
        """Compute the cos/sin tables (again, for a module built on the meta device)."""
        inv_freq = rope_inv_freq(self.head_dim, self.base, self.scaling)
        cos, sin = self._cos_sin(torch.arange(self.max_len)[None], inv_freq)
        self.register_buffer("cos", cos[0], persistent=False)  # (max_len, hs)
        self.register_buffer("sin", sin[0], persistent=False)

    @staticmethod
    def _cos_sin(position_ids: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        angles = position_ids[..., None].double() * inv_freq.to(position_ids.device)  # (B, T, hs/2)
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos().float(), angles.sin().float()

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """x: (B, nh, T, hs), position_ids: (B, T) -> rotated x."""
        dynamic = rope_type(self.scaling) == "dynamic"
        seq_len = int(position_ids.max()) + 1 if dynamic else 0
        if dynamic and seq_len > self.scaling["original_max_position_embeddings"]:
            cos, sin = self._cos_sin(
                position_ids, rope_inv_freq(self.head_dim, self.base, self.scaling, seq_len)
            )
        else:
            cos, sin = self.cos[position_ids], self.sin[position_ids]
        cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)  # (B, 1, T, hs)
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
