"""Our CLIP <-> Hugging Face ``CLIPModel``: the name map and the config translation.

HF keeps query, key and value as three ``nn.Linear`` in both towers; ours fuses them (timm's ``qkv``, our
``qkv_proj``), so they are concatenated on the way in and split on the way out. The image tower is a timm
CLIP-architecture ViT (:func:`~lit_transformers.models.clip.clip_vit`), whose class token and position table
carry a leading batch axis (the ``token`` and ``sequence`` layouts).
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from lit_transformers.models import hf_convert
from lit_transformers.models.clip import CLIP, CLIPConfig, clip_vit, uninitialised
from lit_transformers.models.hf_convert import NameMap, Weight, affine, repeat

FAMILY = "CLIP"
QKV = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
IMAGE_LAYER = [  # timm under visual.blocks.{i}. <- HF under vision_model.encoder.layers.{i}.
    *affine("norm1", "layer_norm1"),
    *affine("attn.qkv", QKV),
    *affine("attn.proj", "self_attn.out_proj"),
    *affine("norm2", "layer_norm2"),
    *affine("mlp.fc1", "mlp.fc1"),
    *affine("mlp.fc2", "mlp.fc2"),
]
TEXT_LAYER = [  # ours under blocks.{i}. <- HF under text_model.encoder.layers.{i}.
    *affine("ln_1", "layer_norm1"),
    *affine("attn.qkv_proj", QKV),
    *affine("attn.out_proj", "self_attn.out_proj"),
    *affine("ln_2", "layer_norm2"),
    *affine("mlp.fc", "mlp.fc1"),
    *affine("mlp.proj", "mlp.fc2"),
]
# the position ids 0..N-1 both embeddings keep as buffers (files of older transformers versions hold them)
BUFFERS = ("embeddings.position_ids",)
# HF's hidden_act -> timm's act_layer and our text_activation (HF's "gelu" is the exact GELU)
ACTIVATIONS = {"quick_gelu": "quick_gelu", "gelu": "gelu"}
# HF's CLIPTextModel pools at the largest id when eos_token_id is 2: the value of configs written before
# transformers fixed it (OpenAI's among them), whose tokenizer's EOS is its largest id
LEGACY_EOS_ID = 2


def name_map(model: CLIP) -> NameMap:
    weights = [
        Weight("visual.cls_token", "vision_model.embeddings.class_embedding", "token"),
        Weight("visual.patch_embed.proj.weight", "vision_model.embeddings.patch_embedding.weight"),
        Weight("visual.pos_embed", "vision_model.embeddings.position_embedding.weight", "sequence"),
        *affine("visual.norm_pre", "vision_model.pre_layrnorm"),  # sic
        *repeat(
            IMAGE_LAYER, len(model.visual.blocks), "visual.blocks.{i}.", "vision_model.encoder.layers.{i}."
        ),
        *affine("visual.norm", "vision_model.post_layernorm"),
        Weight("image_proj.weight", "visual_projection.weight"),
        Weight("token_embedding.weight", "text_model.embeddings.token_embedding.weight"),
        Weight("positions.weight", "text_model.embeddings.position_embedding.weight"),
        *repeat(TEXT_LAYER, model.config.text_layers, "blocks.{i}.", "text_model.encoder.layers.{i}."),
        *affine("ln_final", "text_model.final_layer_norm"),
        Weight("text_proj.weight", "text_projection.weight"),
        Weight("logit_scale", "logit_scale"),
    ]
    return NameMap(FAMILY, tuple(weights), buffers=BUFFERS)


def _activation(tower: dict, which: str) -> str:
    name = tower.get("hidden_act", "quick_gelu")
    if name not in ACTIVATIONS:
        raise ValueError(f"Unsupported CLIP {which} activation {name!r}; supported: {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def config_from_hf(hf: dict) -> CLIPConfig:
    if hf.get("model_type", "clip") != "clip":
        raise ValueError(
            f"Expected a CLIP checkpoint (model_type 'clip'), got model_type={hf.get('model_type')!r}; only "
            "transformers' CLIPModel converts (SigLIP, Chinese-CLIP, ... have other towers)"
        )
    text, vision = hf["text_config"], hf["vision_config"]
    eps = {tower.get("layer_norm_eps", 1e-5) for tower in (text, vision)}
    if eps != {1e-5}:
        raise ValueError(
            f"Only CLIPs with layer_norm_eps 1e-5 (OpenAI's) convert, this one has {sorted(eps)}"
        )
    width = vision["hidden_size"]
    image = clip_vit(
        img_size=vision["image_size"],
        patch_size=vision["patch_size"],
        width=width,
        depth=vision["num_hidden_layers"],
        heads=vision["num_attention_heads"],
        mlp_width=vision["intermediate_size"],
        quick_gelu=_activation(vision, "vision") == "quick_gelu",
        in_chans=vision.get("num_channels", 3),
    )
    eos = text["eos_token_id"]
    return CLIPConfig(
        image=image,
        embed_dim=hf["projection_dim"],
        vocab_size=text["vocab_size"],
        eos_id=text["vocab_size"] - 1 if eos == LEGACY_EOS_ID else eos,
        context_length=text["max_position_embeddings"],
        text_width=text["hidden_size"],
        text_layers=text["num_hidden_layers"],
        text_heads=text["num_attention_heads"],
        text_mlp_width=text["intermediate_size"],
        text_activation=_activation(text, "text"),
        init_logit_scale=hf.get("logit_scale_init_value", CLIPConfig.init_logit_scale),
    )


def _image_tower(visual: nn.Module) -> dict:
    """The HF ``vision_config`` of our image tower; refuses a timm model that is not a CLIP-architecture ViT."""
    from timm.layers import GELU, QuickGELU
    from timm.models.vision_transformer import VisionTransformer

    def clip_block(
        block: nn.Module,
    ) -> bool:  # HF's activations: exact GELU or QuickGELU; no LayerScale, qk-norm
        exact_gelu = isinstance(block.mlp.act, GELU) or getattr(block.mlp.act, "approximate", None) == "none"
        return (
            (exact_gelu or isinstance(block.mlp.act, QuickGELU))
            and isinstance(block.ls1, nn.Identity)
            and isinstance(block.attn.q_norm, nn.Identity)
            and block.attn.qkv.bias is not None
        )

    clip_shaped = (
        isinstance(visual, VisionTransformer)
        and visual.cls_token is not None
        and visual.num_prefix_tokens == 1
        and not visual.no_embed_class
        and not isinstance(visual.norm_pre, nn.Identity)
        and visual.global_pool == "token"
        and isinstance(visual.fc_norm, nn.Identity)
        and visual.patch_embed.proj.bias is None
        and getattr(visual.norm_pre, "eps", None) == 1e-5
        and all(clip_block(block) for block in visual.blocks)
    )
    if not clip_shaped:
        raise ValueError(
            "Only a CLIP-architecture timm ViT image tower (class token, pre-norm, LayerNorm eps 1e-5, token pooling, "
            "no patch bias, GELU or QuickGELU: timm's vit_*_clip_* presets, as from_open_clip/from_hf build) "
            "exports to a Hugging Face CLIPModel"
        )
    block = visual.blocks[0]
    return {
        "hidden_size": visual.embed_dim,
        "intermediate_size": block.mlp.fc1.out_features,
        "num_hidden_layers": len(visual.blocks),
        "num_attention_heads": block.attn.num_heads,
        "num_channels": visual.patch_embed.proj.in_channels,
        "image_size": visual.patch_embed.img_size[0],
        "patch_size": visual.patch_embed.patch_size[0],
        "hidden_act": "quick_gelu" if isinstance(block.mlp.act, QuickGELU) else "gelu",
    }


def hf_config(model: CLIP):
    from transformers import CLIPConfig as HFCLIPConfig

    c = model.config
    if c.eos_id == LEGACY_EOS_ID:
        raise ValueError(
            "Hugging Face's CLIP pools text at the largest id, not at the EOS, when eos_token_id is 2, which this "
            "model's is: retrain with a tokenizer whose EOS id is not 2 to export to HF"
        )
    if c.text_activation not in ACTIVATIONS:
        raise ValueError(
            f"HF CLIP has no {c.text_activation!r} text activation; use one of {sorted(ACTIVATIONS)}"
        )
    text = {
        "vocab_size": c.vocab_size,
        "hidden_size": c.text_width,
        "intermediate_size": c.text_mlp_width or 4 * c.text_width,
        "num_hidden_layers": c.text_layers,
        "num_attention_heads": c.text_heads,
        "max_position_embeddings": c.context_length,
        "hidden_act": c.text_activation,
        "eos_token_id": c.eos_id,
        "bos_token_id": None,  # the tokenizer's, which the model config does not know
        "pad_token_id": None,
    }
    return HFCLIPConfig(
        text_config=text,
        vision_config=_image_tower(model.visual),
        projection_dim=c.embed_dim,
        logit_scale_init_value=c.init_logit_scale,
    )


def from_hf(cls: type[CLIP], path_or_model) -> CLIP:
    """``cls`` holding a ``CLIPModel`` object's or a local CLIP directory's weights."""
    hf, hf_state = hf_convert.load_hf_checkpoint(path_or_model, FAMILY)
    model = uninitialised(cls, config_from_hf(hf))
    hf_convert.load_from_hf(model, hf_state, name_map(model))
    return model


def to_hf(model: CLIP, save_dir: str | Path | None = None):
    """A ``transformers.CLIPModel`` holding ``model``'s weights (saved to ``save_dir`` when given)."""
    from transformers import CLIPModel

    hf_model = CLIPModel(hf_config(model))
    return hf_convert.export_to_hf(model, hf_model, name_map(model), save_dir)
