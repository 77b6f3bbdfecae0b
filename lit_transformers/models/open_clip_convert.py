"""open_clip's ViT CLIPs (OpenAI's ``ViT-B-32``, ``ViT-B-16``, ``ViT-L-14``, LAION's) -> our CLIP: the name map
and the config translation, in the idiom of :mod:`.hf_convert` (unknown or missing weights refused by name).

open_clip keeps each attention's query, key and value fused (``in_proj_weight``) like ours, and its
projections as (in, out) matrices (``visual.proj``, ``text_projection``), ``transposed`` into our Linears.
The image tower becomes a timm CLIP-architecture ViT (:func:`~lit_transformers.models.clip.clip_vit`). What
that ViT or our text tower cannot compute (ResNet or timm image towers, Hugging Face text towers, attention
pooling, LayerScale, ...) is refused by the config field that asks for it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from torch import nn

from lit_transformers.models import hf_convert
from lit_transformers.models.clip import CLIP, CLIPConfig, clip_vit, uninitialised
from lit_transformers.models.hf_convert import NameMap, Weight, affine, repeat

FAMILY = "open_clip"
SUPPORTED = (
    "open_clip's ViT CLIPs with a Transformer text tower (ViT-B-32, ViT-B-16, ViT-L-14, their -quickgelu)"
)


def _layer(norm1: str, qkv: str, proj: str, norm2: str, fc: str, fc_out: str) -> list[Weight]:
    """One residual block under ours' names <- open_clip's, which are the same in both of its towers."""
    return [
        *affine(norm1, "ln_1"),
        Weight(f"{qkv}.weight", "attn.in_proj_weight"),  # nn.MultiheadAttention's names
        Weight(f"{qkv}.bias", "attn.in_proj_bias"),
        *affine(proj, "attn.out_proj"),
        *affine(norm2, "ln_2"),
        *affine(fc, "mlp.c_fc"),
        *affine(fc_out, "mlp.c_proj"),
    ]


IMAGE_LAYER = _layer("norm1", "attn.qkv", "attn.proj", "norm2", "mlp.fc1", "mlp.fc2")  # timm's ViT block
TEXT_LAYER = _layer("ln_1", "attn.qkv_proj", "attn.out_proj", "ln_2", "mlp.fc", "mlp.proj")  # nn's block
# config fields our CLIP reads, and those that change nothing it computes (tokenizer choice, what
# forward returns, open_clip's train-time patch dropout); any other field set off its default is refused
VISION_READ = {"layers", "width", "head_width", "mlp_ratio", "patch_size", "image_size"}
TEXT_READ = {"context_length", "vocab_size", "width", "heads", "layers", "mlp_ratio", "pool_type", "eos_id"}
NEUTRAL = {
    "output_tokens",
    "patch_dropout",
    "pad_id",
    "hf_tokenizer_name",
    "tokenizer_mode",
    "tokenizer_kwargs",
}
TOP_LEVEL = {"embed_dim", "vision_cfg", "text_cfg", "quick_gelu", "init_logit_scale", "init_logit_bias"}


def name_map(model: CLIP) -> NameMap:
    visual = "visual.transformer.resblocks.{i}."
    weights = [
        Weight("visual.cls_token", "visual.class_embedding", "token"),
        Weight("visual.patch_embed.proj.weight", "visual.conv1.weight"),
        Weight("visual.pos_embed", "visual.positional_embedding", "sequence"),
        *affine("visual.norm_pre", "visual.ln_pre"),
        *repeat(IMAGE_LAYER, len(model.visual.blocks), "visual.blocks.{i}.", visual),
        *affine("visual.norm", "visual.ln_post"),
        Weight("image_proj.weight", "visual.proj", "transposed"),
        Weight("token_embedding.weight", "token_embedding.weight"),
        Weight("positions.weight", "positional_embedding"),
        *repeat(TEXT_LAYER, model.config.text_layers, "blocks.{i}.", "transformer.resblocks.{i}."),
        *affine("ln_final", "ln_final"),
        Weight("text_proj.weight", "text_projection", "transposed"),
        Weight("logit_scale", "logit_scale"),
    ]
    return NameMap(FAMILY, tuple(weights))


def _open_clip_config(name: str | dict) -> dict:
    if isinstance(name, dict):
        return name
    import open_clip

    config = open_clip.get_model_config(name)
    if config is None:
        raise ValueError(
            f"Unknown open_clip model {name!r}; see open_clip.list_models() (supported: {SUPPORTED})"
        )
    return config


def _off_default(cfg, read: set[str], where: str) -> list[str]:
    return [
        f"{where}.{f.name}={getattr(cfg, f.name)!r}"
        for f in dataclasses.fields(cfg)
        if f.name not in read | NEUTRAL
        and getattr(cfg, f.name)
        != (f.default if f.default is not dataclasses.MISSING else f.default_factory())
    ]


def config_from_open_clip(config: dict) -> CLIPConfig:
    from open_clip.model import CLIPTextCfg, CLIPVisionCfg

    vision, text = CLIPVisionCfg(**config["vision_cfg"]), CLIPTextCfg(**config["text_cfg"])
    if isinstance(vision.layers, (tuple, list)) or vision.timm_model_name:
        raise ValueError(
            f"This open_clip model's image tower is a {'ResNet' if vision.timm_model_name is None else 'timm model'}"
            f", which our CLIP (a timm CLIP ViT image tower) cannot represent; supported: {SUPPORTED}"
        )
    if text.hf_model_name:
        raise ValueError(
            f"This open_clip model's text tower is Hugging Face's {text.hf_model_name}, which our causal text "
            f"Transformer cannot represent; supported: {SUPPORTED}"
        )
    unsupported = sorted(set(config) - TOP_LEVEL) + _off_default(vision, VISION_READ, "vision_cfg")
    unsupported += _off_default(text, TEXT_READ, "text_cfg")
    if text.pool_type not in ("argmax", "eos"):
        unsupported.append(f"text_cfg.pool_type={text.pool_type!r}")
    if unsupported:
        raise ValueError(f"open_clip options our CLIP cannot compute: {unsupported}; supported: {SUPPORTED}")
    quick_gelu = bool(config.get("quick_gelu", False))
    image = clip_vit(
        img_size=vision.image_size,
        patch_size=vision.patch_size,
        width=vision.width,
        depth=vision.layers,
        heads=vision.width // vision.head_width,
        mlp_width=int(vision.width * vision.mlp_ratio),
        quick_gelu=quick_gelu,
    )
    return CLIPConfig(
        image=image,
        embed_dim=config["embed_dim"],
        vocab_size=text.vocab_size,
        # "argmax" pools at the largest id: open_clip's tokenizers make their EOS the largest
        eos_id=text.vocab_size - 1 if text.pool_type == "argmax" else text.eos_id,
        context_length=text.context_length,
        text_width=text.width,
        text_layers=text.layers,
        text_heads=text.heads,
        text_mlp_width=int(text.width * text.mlp_ratio),
        text_activation="quick_gelu" if quick_gelu else "gelu",
        init_logit_scale=config.get("init_logit_scale", CLIPConfig.init_logit_scale),
    )


def _state_dict(model_or_state_dict) -> dict[str, torch.Tensor]:
    if isinstance(model_or_state_dict, nn.Module):
        return model_or_state_dict.state_dict()
    if isinstance(model_or_state_dict, (str, Path)):
        from open_clip.factory import load_state_dict

        path = Path(model_or_state_dict).expanduser()
        if not path.is_file():
            raise FileNotFoundError(
                f"open_clip checkpoint {path} not found; pass a .pt, .bin or .safetensors file"
            )
        return load_state_dict(str(path))  # open_clip's reader: a "state_dict" entry, DDP's "module." prefix
    return dict(model_or_state_dict)


def read_open_clip_dir(path: str | Path) -> tuple[dict, Path]:
    """(model config, weights file) of a directory laid out as open_clip's Hub repositories are
    (``open_clip_config.json`` with its ``model_cfg``, ``open_clip_model.safetensors`` or
    ``open_clip_pytorch_model.bin``): what ``task.init_from_open_clip`` names."""
    from open_clip.constants import HF_CONFIG_NAME, HF_SAFE_WEIGHTS_NAME, HF_WEIGHTS_NAME

    path = Path(path).expanduser()
    if not (path / HF_CONFIG_NAME).is_file():
        raise FileNotFoundError(
            f"No {HF_CONFIG_NAME} in {path}; init_from_open_clip takes a directory laid out as open_clip's Hub "
            f"repositories are ({HF_CONFIG_NAME} + {HF_SAFE_WEIGHTS_NAME} or {HF_WEIGHTS_NAME})"
        )
    config = json.loads((path / HF_CONFIG_NAME).read_text())["model_cfg"]
    weights = [path / name for name in (HF_SAFE_WEIGHTS_NAME, HF_WEIGHTS_NAME) if (path / name).is_file()]
    if not weights:
        raise FileNotFoundError(f"No {HF_SAFE_WEIGHTS_NAME} or {HF_WEIGHTS_NAME} in {path}")
    return config, weights[0]


def from_open_clip(cls: type[CLIP], model_or_state_dict, name: str | dict) -> CLIP:
    """``cls`` holding an open_clip ViT CLIP's weights (see :meth:`CLIP.from_open_clip`)."""
    state, config = _state_dict(model_or_state_dict), _open_clip_config(name)
    if isinstance(model_or_state_dict, nn.Module):  # the object knows its activation; the name may not say
        config = {
            **config,
            "quick_gelu": _uses_quick_gelu(model_or_state_dict),
        }  # create_model(pretrained="openai")
    model = uninitialised(cls, config_from_open_clip(config))
    bias = state.pop("logit_bias", None)
    if bias is not None and bool(bias.any()):
        raise ValueError(
            f"This open_clip model has a SigLIP-style logit_bias ({bias.flatten()[:1].item():.3g}) added to its "
            f"logits, which our CLIP (logit_scale * cosine) lacks; supported: {SUPPORTED}"
        )
    hf_convert.load_from_hf(model, state, name_map(model))
    return model


def _uses_quick_gelu(model: nn.Module) -> bool:
    """Whether an open_clip model computes QuickGELU: OpenAI's weights do, and ``create_model(name,
    pretrained="openai")`` switches it on whatever the name's config says."""
    from open_clip.transformer import QuickGELU

    return any(isinstance(module, QuickGELU) for module in model.modules())
