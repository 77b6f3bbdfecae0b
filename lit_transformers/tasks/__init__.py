"""One LightningModule per training objective, on the shared base ``Task``. Exports load lazily: a GPT run
imports its task's file, not timm behind ``ImageClassificationTask``."""

from lit_transformers.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "base": ["Task", "eval_mode"],
        "specs": ["build_config", "config_spec", "load_weights"],
        "causal_lm": ["CausalLMTask"],
        "contrastive": ["ContrastiveTask"],
        "dpo": ["DPOTask"],
        "encoder": ["EncoderClassifierTask", "EncoderTask"],
        "grpo": ["GRPOTask"],
        "image_classification": ["ImageClassificationTask"],
        "masked_lm": ["MaskedLMTask"],
        "optim": ["decay_groups", "inverse_sqrt", "warmup_cosine", "warmup_linear"],
        "ppo": ["PPOTask"],
        "reward": ["RewardTask"],
        "sequence_classification": ["SequenceClassificationTask"],
        "sft": ["SFTTask"],
        "token_classification": ["TokenClassificationTask"],
        "translation": ["TranslationTask"],
        "zero_shot": ["ZeroShotTask"],
    },
)
