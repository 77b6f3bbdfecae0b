"""CLIP: a timm image tower and a causal Transformer text tower projected into one L2-normalised space.

Published CLIPs load in and out: :meth:`CLIP.from_open_clip` (open_clip's ViT CLIPs, OpenAI's among them) and
:meth:`CLIP.from_hf` / :meth:`CLIP.to_hf` (``transformers``' ``CLIPModel``). Their image tower becomes a timm
CLIP-architecture ViT (:func:`clip_vit`), so ``image.name`` stays a timm name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import timm
import torch
import torch.nn.functional as F
from timm.layers import QuickGELU
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
    text_mlp_width: int | None = None  # text FFN width; None: 4 x text_width
    text_activation: str = (
        "gelu"  # text FFN: an nn.ACTIVATIONS name, or "quick_gelu" (OpenAI CLIP's x*sigmoid(1.702x))
    )
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
        self.blocks = nn.ModuleList(_text_block(c) for _ in range(c.text_layers))
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

    @classmethod
    def from_open_clip(cls, model_or_state_dict, name: str | dict) -> CLIP:
        """``cls`` holding an open_clip ViT CLIP's weights: a model object, its state dict or a checkpoint file
        (``.pt``/``.bin``/``.safetensors``); ``name`` is its open_clip config name (``ViT-B-32``,
        ``ViT-B-32-quickgelu`` for OpenAI's weights, ...) or that config as a dict."""
        from lit_transformers.models.open_clip_convert import from_open_clip

        return from_open_clip(cls, model_or_state_dict, name)

    @classmethod
    def from_hf(cls, path_or_model) -> CLIP:
        """``cls`` holding a ``transformers`` ``CLIPModel`` object's or a local CLIP directory's weights."""
        from lit_transformers.models.hf_clip import from_hf

        return from_hf(cls, path_or_model)

    def to_hf(self, save_dir: str | Path | None = None):
        """A ``transformers.CLIPModel`` holding this model's weights (saved to ``save_dir`` when given)."""
        from lit_transformers.models.hf_clip import to_hf

        return to_hf(self, save_dir)


class ZeroShotClassifier(nn.Module):
    """A CLIP as an image classifier: logits = logit_scale * image features @ class embeddings, one column per
    class (the normalised mean of its prompts' text embeddings: ``tasks.evaluation.zero_shot_classifier``)."""

    def __init__(self, clip: CLIP, class_embeddings: torch.Tensor):
        super().__init__()
        self.clip = clip
        self.register_buffer("class_embeddings", class_embeddings)  # (embed_dim, n_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.clip.logit_scale.exp() * self.clip.encode_image(images) @ self.class_embeddings  # (B, C)


def uninitialised(cls: type[CLIP], config: CLIPConfig) -> CLIP:
    """``cls(config)`` with its tensors allocated but not initialised, for a converter that loads every one of
    them next (a ViT-L/14's random initialisation takes longer than loading it). CLIP holds no buffers, which
    a converter's state dict would not set."""
    with torch.device("meta"):
        model = cls(config)
    if next(model.buffers(), None) is not None:
        raise RuntimeError("uninitialised() cannot leave buffers unset: build this model with cls(config)")
    return model.to_empty(device="cpu")


def _text_block(c: CLIPConfig) -> nn.Module:
    quick = c.text_activation == "quick_gelu"
    block = DecoderBlock(
        c.text_width,
        c.text_heads,
        d_ff=c.text_mlp_width,
        dropout=c.dropout,
        attn_dropout=c.dropout,
        activation="gelu" if quick else c.text_activation,
    )
    if quick:  # only OpenAI's CLIPs use QuickGELU, which nn.ACTIVATIONS lacks: timm's takes the GELU's place
        block.mlp.act = QuickGELU()
    return block


def clip_vit(
    img_size: int,
    patch_size: int,
    width: int,
    depth: int,
    heads: int,
    mlp_width: int,
    quick_gelu: bool,
    in_chans: int = 3,
) -> dict:
    """``create_backbone`` kwargs of a CLIP-architecture timm ViT (class token, pre-norm ``norm_pre``, a patch
    embedding without bias, LayerNorm eps 1e-5, token pooling): OpenAI's visual tower. The name is timm's preset
    of that size when there is one (``vit_base_patch32_clip_224``), else the base preset, resized."""
    size = {768: "base", 1024: "large", 1280: "huge", 1664: "gigantic"}.get(width, "base")
    name = f"vit_{size}_patch{patch_size}_clip_{'quickgelu_' if quick_gelu else ''}224"
    if not timm.is_model(name):
        name = f"vit_base_patch16_clip_{'quickgelu_' if quick_gelu else ''}224"
    if int(width * (mlp_width / width)) != mlp_width:  # timm sizes its MLP as int(width * mlp_ratio)
        raise ValueError(
            f"A CLIP image tower of width {width} and MLP width {mlp_width} has no timm ViT counterpart"
        )
    return {
        "name": name,
        "img_size": img_size,
        "patch_size": patch_size,
        "in_chans": in_chans,
        "embed_dim": width,
        "depth": depth,
        "num_heads": heads,
        "mlp_ratio": mlp_width / width,
        "act_layer": "quick_gelu" if quick_gelu else "gelu",
        "pre_norm": True,
        "global_pool": "token",
    }
