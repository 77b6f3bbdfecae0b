"""Model families as plain ``nn.Module``s (no Lightning)."""

from lit_transformers.models.gpt import GPT, GPTConfig
from lit_transformers.models.backbone import create_backbone
from lit_transformers.models.clip import CLIP, CLIPConfig

__all__ = ["GPT", "GPTConfig"]
__all__ += ["CLIP", "CLIPConfig", "create_backbone"]
