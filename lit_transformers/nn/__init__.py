"""Pure-torch building blocks (no Lightning): attention, positions, blocks, heads, losses, generation,
and the RLHF math (``nn.rlhf``: reward-model, DPO and PPO pieces). Exports load lazily, like every package's."""

from lit_transformers.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "attention": [
            "KVCache",
            "MultiHeadAttention",
            "causal_mask",
            "padded_attention_mask",
            "padded_position_ids",
            "padding_mask",
            "recorded_attention",
        ],
        "blocks": [
            "activation_module",
            "DecoderBlock",
            "EncoderBlock",
            "FeedForward",
            "LayerCache",
            "TransformerBlock",
            "norm_layer",
            "token_embedding",
        ],
        "flops": ["TRAINING_FLOPS_PER_WEIGHT", "attention_flops", "linear_weights"],
        "generation": ["generate", "logprobs_of", "padded_forward", "sample_next", "token_logprobs"],
        "heads": ["ClassifierHead", "LMHead", "MaskedLMHead", "ScalarHead"],
        "losses": ["IGNORE_INDEX", "ClipLoss", "linear_cross_entropy", "token_cross_entropy", "token_mean"],
        "positions": [
            "LearnedPositions",
            "RotaryEmbedding",
            "SinusoidalPositions",
            "absolute_positions",
            "check_rope_scaling",
            "sinusoidal_table",
        ],
        "rlhf": [
            "AdaptiveKLController",
            "bradley_terry_loss",
            "dpo_loss",
            "last_true_index",
            "truncate_after_eos",
        ],
    },
)
