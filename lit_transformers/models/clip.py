"""CLIP: a timm image tower and a causal Transformer text tower projected into one L2-normalised space."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from lit_transformers.models.backbone import create_backbone
from lit_transformers.nn import DecoderBlock, LearnedPositions, token_embedding


@dataclass
class CLIPConfig:
    image: dict = field(default_factory=lambda: {"name": "vit_tiny_patch16_224"})  # create_backbone kwargs
    embed_dim: int = 512  # shared image-text embedding width
    vocab_size: int | None = None  # None: the task takes its tokenizer's size (OpenAI CLIP's BPE: 49408)
    eos_id: int | None = None  # text features are read at this token's position; None: the tokenizer's EOS
    context_length: int = 77  # max caption tokens including EOS
    text_width: int = 512  # text Transformer width
    text_layers: int = 12  # text Transformer blocks
    text_heads: int = 8  # text attention heads
    dropout: float = 0.0  # text residual/attention dropout
    init_logit_scale: float = math.log(1 / 0.07)  # learnable temperature, stored as log(1/T)


class CLIP(nn.Module):
    def __init__(self, config: CLIPConfig):
        super().__init__()
        self.config = c = config
        self.visual = create_backbone(**c.image, num_classes=0)  # pooled features, no classifier
        self.image_proj = nn.Linear(self.visual.num_features, c.embed_dim, bias=False)
        self.token_embedding = token_embedding(c.vocab_size, c.text_width)
        self.positions = LearnedPositions(c.context_length, c.text_width)
        self.blocks = nn.ModuleList(
            DecoderBlock(
                c.text_width, c.text_heads, dropout=c.dropout, attn_dropout=c.dropout, activation="gelu"
            )
            for _ in range(c.text_layers)
        )
        self.ln_final = nn.LayerNorm(c.text_width)
        self.text_proj = nn.Linear(c.text_width, c.embed_dim, bias=False)
        self.logit_scale = nn.Parameter(torch.tensor(c.init_logit_scale))
        nn.init.normal_(self.token_embedding.weight, std=0.02)
        nn.init.normal_(self.image_proj.weight, std=self.visual.num_features**-0.5)
        nn.init.normal_(self.text_proj.weight, std=c.text_width**-0.5)

    def encode_image(self, images: torch.Tensor, normalize: bool = True) -> torch.Tensor:
        x = self.image_proj(self.visual(images))  # (B, C, H, W) -> (B, embed_dim)
        return F.normalize(x, dim=-1) if normalize else x

    def encode_text(self, input_ids: torch.Tensor, normalize: bool = True) -> torch.Tensor:
        """input_ids: (B, T) captions each ending in EOS, then padding. Causal attention means the EOS
        position has seen the whole caption and nothing after it, so padding needs no mask."""
        B, T = input_ids.shape
        is_eos = input_ids == self.config.eos_id
        if not bool(is_eos.any(dim=1).all()):
            raise ValueError(
                f"Every caption needs an EOS token (id {self.config.eos_id}); tokenize with the datamodule"
            )
        eos_pos = is_eos.int().argmax(dim=1)  # (B,) first EOS, wherever the largest id happens to be
        position_ids = torch.arange(T, device=input_ids.device)[None]
        x = self.token_embedding(input_ids) + self.positions(position_ids)  # (B, T, width)
        for block in self.blocks:
            x = block(x)
        x = self.ln_final(x[torch.arange(B, device=x.device), eos_pos])  # (B, width)
        x = self.text_proj(x)  # (B, embed_dim)
        return F.normalize(x, dim=-1) if normalize else x

    def forward(self, images: torch.Tensor, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.encode_image(images), self.encode_text(input_ids)

    def no_weight_decay(self) -> set[str]:
        """Position embeddings (both towers), class tokens and the temperature stay out of weight decay."""
        skip = getattr(self.visual, "no_weight_decay", lambda: set())()
        return {f"visual.{n}" for n in skip} | {"positions.weight", "logit_scale"}
