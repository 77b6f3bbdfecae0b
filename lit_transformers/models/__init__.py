"""Model families as plain ``nn.Module``s (no Lightning)."""

from lit_transformers.models.gpt import GPT, GPTConfig

__all__ = ["GPT", "GPTConfig"]
