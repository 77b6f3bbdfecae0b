"""Pure-torch building blocks (no Lightning): attention, positions, blocks, generation."""

from lit_transformers.nn.attention import KVCache, MultiHeadAttention, causal_mask, padding_mask
from lit_transformers.nn.blocks import DecoderBlock, EncoderBlock, FeedForward, LayerCache, TransformerBlock
from lit_transformers.nn.generation import generate, left_pad, sample_next
from lit_transformers.nn.positions import (
    LearnedPositions,
    RotaryEmbedding,
    SinusoidalPositions,
    absolute_positions,
    sinusoidal_table,
)

__all__ = [
    "DecoderBlock",
    "EncoderBlock",
    "FeedForward",
    "KVCache",
    "LayerCache",
    "LearnedPositions",
    "MultiHeadAttention",
    "RotaryEmbedding",
    "SinusoidalPositions",
    "TransformerBlock",
    "absolute_positions",
    "causal_mask",
    "generate",
    "left_pad",
    "padding_mask",
    "sample_next",
    "sinusoidal_table",
]
