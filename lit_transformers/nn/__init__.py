"""Pure-torch building blocks (no Lightning): attention, positions, blocks, heads, losses, generation,
and the RLHF math (``nn.rlhf``: reward-model, DPO and PPO pieces)."""

from lit_transformers.nn.attention import (
    KVCache,
    MultiHeadAttention,
    causal_mask,
    padded_attention_mask,
    padded_position_ids,
    padding_mask,
)
from lit_transformers.nn.blocks import DecoderBlock, EncoderBlock, FeedForward, LayerCache, TransformerBlock
from lit_transformers.nn.generation import generate, sample_next, token_logprobs
from lit_transformers.nn.heads import ClassifierHead, LMHead, MaskedLMHead, ScalarHead
from lit_transformers.nn.losses import (
    IGNORE_INDEX,
    ClipLoss,
    linear_cross_entropy,
    token_cross_entropy,
    token_mean,
)
from lit_transformers.nn.positions import (
    LearnedPositions,
    RotaryEmbedding,
    SinusoidalPositions,
    absolute_positions,
    sinusoidal_table,
)
from lit_transformers.nn.rlhf import (
    AdaptiveKLController,
    bradley_terry_loss,
    dpo_loss,
    last_true_index,
    truncate_after_eos,
)

__all__ = [
    "AdaptiveKLController",
    "bradley_terry_loss",
    "dpo_loss",
    "last_true_index",
    "truncate_after_eos",
    "IGNORE_INDEX",
    "ClassifierHead",
    "ClipLoss",
    "DecoderBlock",
    "EncoderBlock",
    "FeedForward",
    "KVCache",
    "LMHead",
    "LayerCache",
    "LearnedPositions",
    "MaskedLMHead",
    "MultiHeadAttention",
    "RotaryEmbedding",
    "ScalarHead",
    "SinusoidalPositions",
    "TransformerBlock",
    "absolute_positions",
    "causal_mask",
    "generate",
    "linear_cross_entropy",
    "padded_attention_mask",
    "padded_position_ids",
    "padding_mask",
    "sample_next",
    "sinusoidal_table",
    "token_cross_entropy",
    "token_logprobs",
    "token_mean",
]
