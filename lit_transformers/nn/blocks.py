"""Transformer blocks shared by every model family: encoder, decoder (GPT, translation), CLIP text."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from lit_transformers.nn.attention import KVCache, MultiHeadAttention
from lit_transformers.nn.positions import RotaryEmbedding

ACTIVATIONS = {
    "gelu": lambda: nn.GELU(),
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),  # GPT-2's "gelu_new"
    "relu": lambda: nn.ReLU(),  # the original Transformer
    "silu": lambda: nn.SiLU(),  # "swish": Marian / OPUS-MT
}


def activation_module(name: str) -> nn.Module:
    """The ``ACTIVATIONS`` entry ``name`` (FFNs and the MLM head share the table)."""
    if name not in ACTIVATIONS:
        raise ValueError(f"Unknown activation {name!r}; choose one of {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]()


def token_embedding(vocab_size: int | None, dim: int, **kwargs) -> nn.Embedding:
    """An ``nn.Embedding`` over a vocabulary, refusing the ``vocab_size=None`` that model configs default to
    (a task fills it from its tokenizer; a model built by hand must set it)."""
    if vocab_size is None:
        raise ValueError(
            "vocab_size is None: set it in the model config (the tasks take it from their tokenizer)"
        )
    return nn.Embedding(vocab_size, dim, **kwargs)


NORMS = {
    "layernorm": lambda d, eps, bias: nn.LayerNorm(d, eps=eps, bias=bias),  # GPT-2, BERT
    "rmsnorm": lambda d, eps, bias: nn.RMSNorm(d, eps=eps),  # Llama, Qwen2, Mistral: no bias, no centring
}


def norm_layer(kind: str, d_model: int, eps: float = 1e-5, bias: bool = True) -> nn.Module:
    """The ``NORMS`` entry ``kind`` over ``d_model`` features."""
    if kind not in NORMS:
        raise ValueError(f"Unknown norm {kind!r}; choose one of {sorted(NORMS)}")
    return NORMS[kind](d_model, eps, bias)


class FeedForward(nn.Module):
    """Position-wise FFN: Linear(d, d_ff) -> activation -> Linear(d_ff, d) -> dropout.

    ``gated`` (GLU variants, Shazeer 2020; SwiGLU with silu, as Llama): proj(act(x W_gate) * (x W_up)), the
    gate and up projections fused in ``fc`` as [gate | up].
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        activation: str = "gelu",
        dropout: float = 0.0,
        bias=True,
        gated: bool = False,
    ):
        super().__init__()
        self.gated = gated
        self.fc = nn.Linear(d_model, 2 * d_ff if gated else d_ff, bias=bias)
        self.act = activation_module(activation)
        self.proj = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        if self.gated:
            gate, up = h.chunk(2, dim=-1)
            return self.dropout(self.proj(self.act(gate) * up))
        return self.dropout(self.proj(self.act(h)))


@dataclass
class LayerCache:
    """Per-layer incremental-decoding state: self-attention keys/values, and encoder memory keys/values."""

    self_attn: KVCache
    cross_attn: KVCache | None = None


class TransformerBlock(nn.Module):
    """Self-attention, optional cross-attention and FFN sublayers, each wrapped in a residual.

    ``norm_first=True`` is pre-norm (GPT-2: x + f(LN(x))); ``False`` is the original post-norm
    Transformer (LN(x + f(x))). Use :func:`EncoderBlock` / :func:`DecoderBlock` for the usual setups.
    ``norm`` names the norm (:data:`NORMS`), ``gated_mlp`` the FFN's form (:class:`FeedForward`);
    ``n_kv_head``, ``qkv_bias``, ``sliding_window`` and ``head_dim`` go to the self-attention (:class:`MultiHeadAttention`).
    """

    def __init__(
        self,
        d_model: int,
        n_head: int,
        d_ff: int | None = None,
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        activation: str = "gelu",
        norm_first: bool = True,
        causal: bool = False,
        cross_attention: bool = False,
        context_dim: int | None = None,
        bias: bool = True,
        norm_eps: float = 1e-5,
        norm: str = "layernorm",
        gated_mlp: bool = False,
        n_kv_head: int | None = None,
        qkv_bias: bool | None = None,
        sliding_window: int | None = None,
        head_dim: int | None = None,
    ):
        super().__init__()
        self.norm_first, self.causal = norm_first, causal
        self.ln_1 = norm_layer(norm, d_model, norm_eps, bias)
        self.attn = MultiHeadAttention(
            d_model,
            n_head,
            attn_dropout,
            bias,
            n_kv_head=n_kv_head,
            qkv_bias=qkv_bias,
            sliding_window=sliding_window,
            head_dim=head_dim,
        )
        if cross_attention:
            self.ln_cross = norm_layer(norm, d_model, norm_eps, bias)
            self.cross_attn = MultiHeadAttention(
                d_model, n_head, attn_dropout, bias, cross_attention=True, context_dim=context_dim
            )
        else:
            self.cross_attn = None
        self.ln_2 = norm_layer(norm, d_model, norm_eps, bias)
        self.mlp = FeedForward(d_model, d_ff or 4 * d_model, activation, dropout, bias, gated=gated_mlp)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        context: torch.Tensor | None = None,
        context_mask: torch.Tensor | None = None,
        rotary: RotaryEmbedding | None = None,
        position_ids: torch.Tensor | None = None,
        cache: LayerCache | None = None,
    ) -> torch.Tensor:
        """x: (B, T, d_model); context: (B, S, d_context) encoder memory for cross-attention."""

        def attend_self(h: torch.Tensor) -> torch.Tensor:
            kv_cache = cache.self_attn if cache else None
            out = self.attn(
                h,
                mask=mask,
                is_causal=self.causal,
                rotary=rotary,
                position_ids=position_ids,
                kv_cache=kv_cache,
            )
            return self.dropout(out)

        def attend_context(h: torch.Tensor) -> torch.Tensor:
            kv_cache = cache.cross_attn if cache else None
            return self.dropout(self.cross_attn(h, context=context, mask=context_mask, kv_cache=kv_cache))

        if self.norm_first:  # pre-norm (GPT-2): x + f(LN(x))
            x = x + attend_self(self.ln_1(x))
            if self.cross_attn is not None:
                x = x + attend_context(self.ln_cross(x))
            return x + self.mlp(self.ln_2(x))
        # post-norm (the original Transformer, BERT): LN(x + f(x))
        x = self.ln_1(x + attend_self(x))
        if self.cross_attn is not None:
            x = self.ln_cross(x + attend_context(x))
        return self.ln_2(x + self.mlp(x))


def EncoderBlock(d_model: int, n_head: int, **kwargs) -> TransformerBlock:
    """Bidirectional self-attention + FFN (Transformer encoder, BERT)."""
    return TransformerBlock(d_model, n_head, causal=False, cross_attention=False, **kwargs)


def DecoderBlock(d_model: int, n_head: int, cross_attention: bool = False, **kwargs) -> TransformerBlock:
    """Masked self-attention (+ cross-attention over encoder memory for translation) + FFN."""
    return TransformerBlock(d_model, n_head, causal=True, cross_attention=cross_attention, **kwargs)
